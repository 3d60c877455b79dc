"""Every learner command against every state a learner can leave a course in.

For each (command, state): no Python traceback, exit code 0, 1 or 2 (never 3, an
internal error), and no file under ``exercises/`` changed, except by ``reset``, which
must always leave a backup of the learner's version under ``.oomlab/backups/`` first.

Each state gets its own course folder (made by ``oomlab init``); the states run side by
side, their commands one after another, each command on the state freshly applied. Without
a GPU ``run`` and ``check`` end in a clear no-GPU message, which is fine here.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from oomlab.course.shipped import init_course
from tests.forked_commands import oomlab_commands

REPO = Path(__file__).resolve().parents[1]
ID = "eval-graphs"
COMMANDS = {
    "overview": [],
    "list": ["list"],
    "hint": ["hint", ID],
    "reset": ["reset", ID],
    "solution": ["solution", ID],
    "run": ["run", ID],
    "check": ["check", ID],
    "doctor": ["doctor"],
    "stop": ["stop"],
}
STATES = ("edited", "deleted", "unreadable", "syntax-error", "damaged-state", "manifest-broken")
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def learner_file(root: Path) -> Path:
    return root / "exercises" / ID / "train.py"


def apply_state(root: Path, state: str, original: bytes) -> None:
    """Put the course into ``state``: the learner's file as the state has it, and a state file marking ID passed."""
    path = learner_file(root)
    if path.exists():
        path.chmod(0o644)
    path.write_bytes(original)
    progress = root / ".oomlab" / "state.json"
    progress.parent.mkdir(exist_ok=True)
    passed = json.dumps({"passed": {ID: "2025-01-01T00:00:00"}, "hints": {}})  # so that `solution` shows the diff
    progress.write_bytes(b"\xff{not json" if state == "damaged-state" else passed.encode())
    if state == "edited":
        path.write_bytes(original + b"# my attempt\n")
    elif state == "deleted":
        path.unlink()
    elif state == "unreadable":
        path.chmod(0)
    elif state == "syntax-error":
        assert original.count(b"losses = []") == 1
        path.write_bytes(original.replace(b"losses = []", b"losses = [", 1))
    elif state == "manifest-broken":  # the learner's copy; the course's own grades
        path.with_name("exercise.toml").write_bytes(b"budget_bytes = = 1\n")


def exercise_files(root: Path) -> dict[str, object]:
    """Every file under exercises/: its bytes, or (for one we may not read) its identity and times."""
    files = {}
    for path in sorted((root / "exercises").rglob("*")):
        if path.is_file():
            try:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
            except PermissionError:
                st = path.stat()
                files[path.relative_to(root).as_posix()] = ("unreadable", st.st_ino, st.st_size, st.st_mtime_ns)
    return files


def backups(root: Path) -> dict[str, bytes]:
    folder = root / ".oomlab" / "backups" / ID
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


@dataclass
class Outcome:
    rc: int
    out: str
    before: dict
    after: dict
    backups_before: dict
    backups_after: dict


def run_command(root: Path, args: list[str]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OOMLAB_ROOT", "FORCE_COLOR", "TTY_COMPATIBLE", "CLICOLOR_FORCE")}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", COLUMNS="120", GIT_CEILING_DIRECTORIES=str(root.parent))
    done = oomlab_commands.run(list(args), root, env, 120, program="oomlab")  # a process of its own, forked
    return done.returncode, done.stdout + done.stderr


def run_state(root: Path, state: str, original: bytes) -> dict[str, Outcome]:
    outcomes = {}
    for name, args in COMMANDS.items():
        apply_state(root, state, original)
        before, kept = exercise_files(root), backups(root)
        rc, out = run_command(root, args)
        outcomes[name] = Outcome(rc, out, before, exercise_files(root), kept, backups(root))
    if learner_file(root).exists():
        learner_file(root).chmod(0o644)  # so that pytest can clean up
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[str, str], Outcome]:
    roots = {}
    for state in STATES:
        if state == "unreadable" and AS_ROOT:
            continue
        roots[state] = tmp_path_factory.mktemp(state) / "course"
        init_course(roots[state])
    original = learner_file(next(iter(roots.values()))).read_bytes()
    with ThreadPoolExecutor(len(roots)) as pool:
        futures = {state: pool.submit(run_state, root, state, original) for state, root in roots.items()}
        found = {state: future.result() for state, future in futures.items()}
    return {(state, name): outcome for state, by_name in found.items() for name, outcome in by_name.items()}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("state", STATES)
def test_a_learner_command_in_any_state_gives_a_clear_answer_and_keeps_the_learners_files(outcomes, state, command):
    if state == "unreadable" and AS_ROOT:
        pytest.skip("running as root: chmod 000 does not stop root from reading (see the in-process test below)")
    o = outcomes[(state, command)]
    assert "Traceback" not in o.out, o.out
    assert o.rc in (0, 1, 2), o.out
    assert "internal error" not in o.out, o.out
    learner = f"exercises/{ID}/train.py"
    if command != "reset":
        assert o.after == o.before, o.out
        return
    # reset may change the learner's file, and only that one; a version it replaced is kept first.
    assert {k: v for k, v in o.after.items() if k != learner} == {k: v for k, v in o.before.items() if k != learner}
    mine = o.before.get(learner)
    new_backups = {k: v for k, v in o.backups_after.items() if k not in o.backups_before}
    if o.rc != 0:
        assert o.after == o.before, o.out  # a reset that could not go through changed nothing
    elif isinstance(mine, bytes) and mine != o.after.get(learner):
        assert list(new_backups.values()) == [mine], o.out
    if state == "deleted":
        assert o.rc == 0 and "was missing: restored the original" in o.out


def test_the_states_are_what_they_say(outcomes):
    """A guard on apply_state itself: each state really is the state it is named after."""
    learner = f"exercises/{ID}/train.py"
    original = outcomes[("damaged-state", "list")].before[learner]
    assert isinstance(original, bytes) and b"losses = []" in original
    assert outcomes[("edited", "list")].before[learner] == original + b"# my attempt\n"
    assert learner not in outcomes[("deleted", "list")].before
    assert b"losses = []" not in outcomes[("syntax-error", "list")].before[learner]
    assert "Syntax error" in outcomes[("syntax-error", "run")].out
    assert "was damaged" in outcomes[("damaged-state", "list")].out
    assert f"Hint 1 of 3 for {ID}" in outcomes[("manifest-broken", "hint")].out  # it blocks nothing
    assert f"exercises/{ID}/exercise.toml differs from the course's own" in outcomes[("manifest-broken", "run")].out


# --- the unreadable file, simulated in-process (root reads a chmod 000 file anyway) ------------------------


@pytest.fixture
def unreadable_course(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "course"
    init_course(root)
    (root / ".oomlab" / "state.json").write_text(json.dumps({"passed": {ID: "2025-01-01T00:00:00"}}))
    path = learner_file(root)
    path.write_text(path.read_text() + "# my attempt\n")
    real_open = io.open

    def refuse(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", refuse)
    monkeypatch.setattr("builtins.open", refuse)
    monkeypatch.chdir(root)
    monkeypatch.delenv("OOMLAB_ROOT", raising=False)
    monkeypatch.setenv("COLUMNS", "120")  # CUDA_VISIBLE_DEVICES stays: torch has started in this process already
    return root


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_learner_command_with_an_unreadable_exercise_file_gives_a_clear_answer(unreadable_course, capsys, command):
    from oomlab.cli import main

    path = learner_file(unreadable_course)
    before = path.stat().st_mtime_ns, path.stat().st_size
    try:
        main(COMMANDS[command])
        rc = 0
    except SystemExit as done:
        rc = done.code or 0
    captured = capsys.readouterr()
    out = " ".join(re.sub(r"[│╭╮╰╯─]+", " ", captured.out + captured.err).split())
    assert rc in (0, 1, 2) and "Traceback" not in out and "internal error" not in out, out
    assert (path.stat().st_mtime_ns, path.stat().st_size) == before, out
    if command in ("run", "check", "reset"):
        assert rc == 2 and f"Cannot read your {'version' if command == 'reset' else 'exercise'} exercises/{ID}/train.py" in out, (
            out
        )
        assert "Permission denied" in out and f"chmod u+r exercises/{ID}/train.py" in out, out
        assert not (unreadable_course / ".oomlab" / "backups").exists()
