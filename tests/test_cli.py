"""The ``oomlab`` command as a learner meets it: exit codes, one clear message, never a traceback.

Each case runs ``python -m graders`` in a fresh process against a copy of the
course. Most commands do not import torch and take a fraction of a second; the
two that measure or diagnose do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forked_commands import oomlab_commands

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

REPO = Path(__file__).resolve().parents[1]
BOX = re.compile(r"[│╭╮╰╯─┃━┏┓┗┛┡┩╇┳┻╋┣┫━┯┷┼]+")


def oomlab(root: Path, *args: str, columns: int = 200, raw: bool = False) -> tuple[int, str]:
    """Run the CLI in ``root`` (tests/forked_commands.py); return the exit code and stdout+stderr with the boxes and wrapping flattened (or ``raw``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")}
    env.update(
        OOMLAB_ROOT=str(root),
        COLUMNS=str(columns),
        PYTHONPATH=str(REPO),  # the graders under test, whether or not the course is installed
        CUDA_VISIBLE_DEVICES="",  # the same answers on a machine with a GPU
    )
    proc = oomlab_commands.run(list(args), root, env, 120, program="oomlab")  # a process of its own, forked
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode != 3 and not (root / ".oomlab" / "last-error.txt").exists(), out
    return proc.returncode, out if raw else " ".join(BOX.sub(" ", out).split())


@pytest.fixture
def root(course_copy) -> Path:
    return course_copy


def learner_file(root: Path, ex_id: str = "eval-graphs") -> Path:
    return root / "exercises" / ex_id / "train.py"


def ids(root: Path) -> list[str]:
    """The course's exercises in teaching order, as `oomlab list` numbers them."""
    from oomlab.course import Course

    return [e.id for e in Course(root, working_tree=True).exercises]  # no first sight: the commands under test take it


def test_help(root):
    rc, out = oomlab(root, "--help")
    assert rc == 0
    for command in ("run", "check", "hint", "watch", "reset", "solution", "doctor", "init", "list", "dev"):
        assert re.search(rf"\b{command}\b", out), command


def test_no_arguments_shows_progress_and_what_to_do(root):
    first, second, *_ = every = ids(root)
    rc, out = oomlab(root)
    assert rc == 0
    assert f"0/{len(every)} exercises passed" in out
    assert f"Now: {first}" in out
    assert f"oomlab run {first}" in out
    # Once the first one passes, the second is the current one.
    state = root / ".oomlab" / "state.json"
    state.write_text(json.dumps({"passed": {first: "2025-01-01T00:00:00"}, "hints": {}}))
    rc, out = oomlab(root)
    assert rc == 0
    assert f"1/{len(every)} exercises passed" in out
    assert f"Now: {second}" in out and f"oomlab run {second}" in out


def test_list(root):
    from oomlab.course import Course

    every = ids(root)
    rc, out = oomlab(root, "list")
    assert rc == 0
    assert re.search(rf"1 {every[0]} .* current", out)
    assert re.search(rf"2 {every[1]} .* to do", out)
    assert f"{every.index('one-hot-peak') + 1} one-hot-peak" in out
    assert "1.00 GiB" in out  # eval-graphs' budget
    # Grouped by module, in the modules' order.
    modules = Course(root, working_tree=True).modules
    shown = [out.index(m.title) for m in modules if m.title in out]
    assert len(shown) == len(modules) >= 4 and shown == sorted(shown)
    assert out.index("Step 2: hunt dangling references") < out.index("eval-graphs") < out.index("Step 3: profile the peak")
    # Module 1 comes before the steps are taught: its exercises' step reads "0→" (read the error first), no other's does.
    from oomlab.course.modules import met_before_its_step

    for ex in Course(root).exercises:
        row = re.search(rf"\d+ +{ex.id} .*", out)[0]
        assert (" 0→" in row) == met_before_its_step(ex.module, ex.step), row
    # An estimate exercise's step is "–": nothing of it runs, and the legend says so where the course has one.
    has_estimates = any(ex.is_estimate for ex in Course(root).exercises)
    assert ("Steps: – size it before it runs, 0 read the error first, 1 snapshot" in out) == has_estimates
    assert "0 read the error first, 1 snapshot" in out


def test_hint_advances(root):
    ex_id = ids(root)[0]
    rc, first = oomlab(root, "hint", "1")
    assert rc == 0 and f"Hint 1 of 3 for {ex_id}" in first
    assert "again for the next" in first
    rc, second = oomlab(root, "hint", "1")
    assert rc == 0 and f"Hint 2 of 3 for {ex_id}" in second


def test_interview_asks_first_and_answers_on_request(root):
    from oomlab.course import Course

    ex = Course(root).get("eval-graphs")
    rc, out = oomlab(root, "interview", "eval-graphs")
    assert rc == 0 and ex.interview.question[:40] in " ".join(out.split())
    assert "--answer" in out and ex.interview.answer.split()[0] not in out.split("Answer it aloud")[0].split("Interview")[0]
    rc, out = oomlab(root, "interview", "eval-graphs", "--answer")
    assert rc == 0 and " ".join(ex.interview.answer.split()[:8]) in " ".join(out.replace("│", " ").split())


def test_unknown_exercise(root):
    rc, out = oomlab(root, "hint", "feature-cach")
    assert rc == 2
    assert "There is no exercise 'feature-cach'" in out
    assert "Did you mean 'feature-cache'?" in out


def test_check_with_a_syntax_error(root):
    path = learner_file(root)
    broken = path.read_text().replace("losses = []", "losses = [", 1)
    path.write_text(broken)
    rc, out = oomlab(root, "check", "eval-graphs")
    assert rc == 1
    assert "Syntax error" in out
    assert "exercises/eval-graphs/train.py:" in out
    assert "your file was not changed" in out
    assert path.read_text() == broken


def test_check_without_a_gpu(root):
    from oomlab.measure.machine import has_nvidia_driver

    rc, out = oomlab(root, "check", "eval-graphs")
    assert rc == 2
    if has_nvidia_driver():  # a driver, no GPU visible (CUDA_VISIBLE_DEVICES=""): torch is asked
        assert "No CUDA GPU is visible" in out
    else:  # no driver at all: said at once, before torch is imported
        assert "has no NVIDIA driver" in out and "grading eval-graphs needs an NVIDIA GPU" in out, out
    assert "`oomlab list`, `hint`, `interview` and `reset` still work" in out and "`oomlab doctor` lists them" in out


def test_run_with_the_file_deleted_then_reset(root):
    oomlab(root, "list")  # first sight: oomlab keeps the originals
    path = learner_file(root)
    original = path.read_text()
    path.unlink()
    rc, out = oomlab(root, "run", "eval-graphs")
    assert rc == 1
    assert "exercises/eval-graphs/train.py does not exist" in out
    assert "`oomlab reset eval-graphs` puts the original back" in out
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0 and path.read_text() == original


def test_reset_after_an_edit(root):
    rc, _ = oomlab(root, "list")  # first sight, before any edit; the copy is not a git checkout
    assert rc == 0
    path = learner_file(root)
    original = path.read_text()
    edited = original.replace("losses = []", "losses = []  # my attempt", 1)
    path.write_text(edited)
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0
    assert path.read_text() == original
    match = re.search(r"Your version is kept at (\S+)\.", out)
    assert match, out
    backup = root / match.group(1)
    assert backup.read_text() == edited
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0 and "already the original" in out


def test_solution_opens_only_once_passed(root):
    rc, out = oomlab(root, "solution", "eval-graphs")
    assert rc == 1
    assert "opens once eval-graphs passes" in out
    (root / ".oomlab").mkdir(exist_ok=True)
    (root / ".oomlab" / "state.json").write_text(json.dumps({"passed": {"eval-graphs": "2025-01-01T00:00:00"}}))
    rc, out = oomlab(root, "solution", "eval-graphs")
    assert rc == 0
    assert "solutions/eval-graphs/train.py" in out
    assert "no_grad" in out  # the reference fix, shown as a diff


def test_a_malformed_manifest_blocks_only_its_own_exercise_and_renumbers_nothing(root):
    every = ids(root)
    n, k = len(every), every.index("one-hot-peak") + 1  # its number stays its own
    after = every[k]  # the exercise after it keeps its number too: `oomlab hint K+1` opens the same one
    path = root / "exercises" / "one-hot-peak" / "exercise.toml"
    path.write_text(path.read_text().replace('step = "profile"', 'step = = "profile"'))
    rc, out = oomlab(root, "list")
    assert rc == 0
    assert re.search(rf"{k} one-hot-peak exercises/one-hot-peak/exercise.toml is not valid TOML.* broken", out), out
    assert f" {k + 1} {after} " in out
    rc, out = oomlab(root)
    assert rc == 0 and f"0/{n} exercises passed" in out
    assert f"{k}. one-hot-peak broken: exercises/one-hot-peak/exercise.toml is not valid TOML" in out
    assert f"{k + 1}. {after} " in out
    rc, out = oomlab(root, "hint", str(k + 1))
    assert rc == 0 and f"Hint 1 of 3 for {after}" in out
    for command in ("hint", "reset", "run", "check", "solution"):
        rc, out = oomlab(root, command, "one-hot-peak")
        assert rc == 2 and f"{path} is not valid TOML" in out, (command, out)
    rc, out = oomlab(root, "hint", str(k))  # by its number in `oomlab list`, too
    assert rc == 2 and f"{path} is not valid TOML" in out
    rc, out = oomlab(root, "hint", "eval-graphs")
    assert rc == 0 and "Hint 1 of 3 for eval-graphs" in out
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0 and "already the original" in out


def test_an_exercise_folder_and_the_list_of_modules_that_disagree_say_which_file_to_edit_and_what_to_add(root):
    every = ids(root)
    shutil.copytree(root / "exercises" / "eval-graphs", root / "exercises" / "my-exercise")
    shutil.rmtree(root / "exercises" / "retain-graph")
    listed = root / "exercises" / "modules.toml"
    rc, out = oomlab(root, "list")
    assert rc == 0, out
    k = every.index("retain-graph") + 1
    assert re.search(rf" {k} retain-graph exercises/modules.toml names the exercise 'retain-graph' .* broken", out), out
    assert f" {k + 1} {every[k]} " in out, "the exercise after it keeps its number"
    assert re.search(rf" {len(every) + 1} my-exercise exercises/my-exercise is an exercise folder that .* broken", out), out
    rc, out = oomlab(root, "hint", "my-exercise")
    assert rc == 2 and f'Add "my-exercise" to the exercises of its module in {listed}' in out, out
    rc, out = oomlab(root, "hint", str(k))
    assert rc == 2 and "Add the folder exercises/retain-graph/ with its script and exercise.toml, or take" in out, out
    assert f"out of {listed}" in out


def test_doctor_without_a_gpu(root):
    import torch  # the test session has imported it already (conftest checks for CUDA)

    from oomlab.measure.machine import has_nvidia_driver

    rc, out = oomlab(root, "doctor")
    assert rc == 1
    assert "FAIL" in out
    assert f"{root}: {len(ids(root))} exercises, every manifest valid" in out
    if not has_nvidia_driver():
        assert "no NVIDIA GPU on this machine" in out and "install a CUDA build" not in out
    else:
        assert ("install a CUDA build of torch" if torch.version.cuda is None else "sees no GPU") in out


def test_doctor_on_a_machine_with_no_nvidia_driver_says_so_and_lists_what_still_works(root, monkeypatch):
    from oomlab.measure import machine

    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    monkeypatch.setattr(machine.os.path, "exists", lambda path: False if "nvidia" in str(path) else os.access(path, os.F_OK))
    monkeypatch.chdir(REPO)
    assert not machine.has_nvidia_driver()
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine with no driver
    rows, ready = machine.diagnose()
    assert not ready
    assert ("fail", "GPU") in {(level, item) for level, item, _ in rows}
    assert not any("install a CUDA build" in finding for *_, finding in rows)
    works = " ".join(cmd for cmd, _ in machine.without_a_gpu())
    for command in ("oomlab hint ID", "oomlab interview ID", "oomlab reset ID", "oomlab list", "make docs"):
        assert command in works
    bug = sorted((REPO / "course" / "figures").glob("*-bug-snapshot.pickle"))[0].name  # one the reader has
    fix = bug.replace("-bug-", "-fix-")
    assert f"oomlab snapshot course/figures/{bug}" in works
    assert f"oomlab compare course/figures/{bug} course/figures/{fix}" in works


def test_doctor_with_no_nvidia_driver_reads_torchs_version_without_importing_torch():
    """Nothing can be measured there, so doctor does not spend the seconds importing torch takes to say so."""
    code = (
        "import sys; from oomlab.measure import machine; machine.has_nvidia_driver = lambda: False; "
        "rows, ready = machine.diagnose(); print('torch' in sys.modules, ready, [r[:2] for r in rows if r[1] in ('torch', 'GPU')])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False", "[('ok',", "'torch'),", "('fail',", "'GPU')]"], done.stdout + done.stderr


def test_doctor_judges_torchs_version():
    from oomlab.measure.machine import torch_row

    assert torch_row("2.13.0+cpu") == ("ok", "torch", "2.13.0+cpu")
    assert torch_row("2.3.1")[0] == "fail" and "needs 2.4 or newer" in torch_row("2.3.1")[2]
    assert torch_row(None) == ("fail", "torch", "not installed: `make start` installs it")


def test_a_course_installed_from_a_wheel_offers_the_snapshots_the_wheel_ships(tmp_path, monkeypatch):
    """No checkout, no GPU: ``oomlab init`` copied the wheel's two snapshots, and doctor points at them."""
    from oomlab.course import shipped
    from oomlab.measure import machine

    wheel = tmp_path / "site-packages" / "oomlab" / "_course"
    for folder in ("exercises", "graders"):
        shutil.copytree(REPO / folder, wheel / folder)
    (wheel / shipped.SNAPSHOTS).mkdir()
    for side in ("bug", "fix"):  # as setup.py ships them
        shutil.copyfile(
            REPO / "course" / "figures" / f"feature-cache-{side}-snapshot.pickle",
            wheel / shipped.SNAPSHOTS / f"feature-cache-{side}-snapshot.pickle",
        )
    monkeypatch.setattr(shipped, "shipped_root", lambda: wheel)
    shipped.init_course(tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine" / "snapshots").iterdir()) == [
        "feature-cache-bug-snapshot.pickle",
        "feature-cache-fix-snapshot.pickle",
    ]
    monkeypatch.chdir(tmp_path / "mine")
    monkeypatch.setenv("OOMLAB_ROOT", str(tmp_path / "mine"))
    works = " ".join(cmd for cmd, _ in machine.without_a_gpu())
    assert "oomlab compare snapshots/feature-cache-bug-snapshot.pickle snapshots/feature-cache-fix-snapshot.pickle" in works
    assert "make docs" not in works, "a pip-installed course has no site to build"


def test_the_wheel_ships_snapshots_that_exist():
    import ast

    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "SNAPSHOTS")
    assert names and all((REPO / "course" / "figures" / name).is_file() for name in names), names


def test_doctor_with_a_driver_and_a_cpu_only_torch_says_to_install_a_cuda_build(monkeypatch):
    import torch

    from oomlab.measure import machine

    monkeypatch.setattr(machine, "has_nvidia_driver", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", None)
    rows, ready = machine.diagnose()
    assert not ready
    assert any(item == "CUDA" and "install a CUDA build of torch" in finding for _, item, finding in rows)


def test_watch_checks_once_and_says_what_it_watches(root):
    first = ids(root)[0]  # watch follows the current exercise
    path = learner_file(root, first)
    path.write_text("for i in range(3)\n    pass\n")
    rc, out = oomlab(root, "watch", "--max-checks", "1", "--interval", "0.1")
    assert rc == 0
    assert "Syntax error" in out and f"{first} does not pass yet" in out
    assert f"Watching exercises/{first}/train.py" in out
    assert path.read_text() == "for i in range(3)\n    pass\n"
    from oomlab.measure.machine import has_nvidia_driver

    if not has_nvidia_driver():  # nothing can be measured here: no server imports torch for nothing
        assert not any((root / ".oomlab" / "servers").glob("*"))


@pytest.mark.parametrize(
    "kept,runner,expected",
    [
        (True, "forked", ([""], [])),
        (True, "fresh", ([""], [[""]])),  # the kept server refused this terminal's run (another environment)
        (False, "fresh", ([], [[""]])),
    ],
    ids=["a-check-kept-one", "kept-one-cannot-serve", "none-kept"],
)
def test_watch_uses_the_server_a_check_or_run_keeps_rather_than_import_torch_again(
    root, monkeypatch, capsys, kept, runner, expected
):
    import contextlib

    from oomlab.cli import learner, main
    from oomlab.grading.checks import CheckResult
    from oomlab.grading.verdict import Report
    from oomlab.measure import keeper, warm
    from oomlab.measure.harness import Measurement

    touched, started = [], []
    monkeypatch.setattr(learner, "has_nvidia_driver", lambda: True)
    monkeypatch.setattr(warm.WarmServer, "find", lambda root, conf: object() if kept else None)
    monkeypatch.setattr(keeper, "keep_warm", lambda root, conf: touched.append(conf) or False)
    monkeypatch.setattr(warm, "serving", lambda root, confs, env: started.append(confs) or contextlib.nullcontext([]))
    m = Measurement(script="train.py", status="ok", runner=runner)
    failed = CheckResult("no_oom", False, "an OOM", "none", "it must fit")  # not passed: watch stays on the exercise
    monkeypatch.setattr(learner, "grade_and_show", lambda ex, progress: Report(ex, m, None, [failed]))
    with pytest.raises(SystemExit) as done:
        main(["watch", "eval-graphs", "--max-checks", "1"])
    assert done.value.code == 0, capsys.readouterr().out
    assert (touched, started) == expected, "a kept server is used where it can serve, and kept from idling"


def test_reset_of_a_deleted_file_says_it_restored_a_missing_file(root):
    oomlab(root, "list")  # first sight: the originals are kept
    path = learner_file(root)
    original = path.read_text()
    path.unlink()
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0 and path.read_text() == original
    assert "exercises/eval-graphs/train.py was missing: restored the original" in out
    assert "already the original" not in out


def test_a_damaged_state_file_is_kept_and_named_once(root):
    state = root / ".oomlab" / "state.json"
    state.parent.mkdir()
    state.write_text("{not json")
    rc, out = oomlab(root, "list")
    assert rc == 0
    kept = list(state.parent.glob("state.damaged-*.json"))
    assert len(kept) == 1 and kept[0].read_text() == "{not json"
    assert f"progress file .oomlab/state.json was damaged. It was moved aside to .oomlab/{kept[0].name}" in out
    rc, out = oomlab(root, "list")  # told once: the next command finds nothing damaged
    assert rc == 0 and "damaged" not in out


def test_an_unwritable_state_folder_is_a_clear_error_naming_the_path(root):
    (root / ".oomlab").write_text("")  # a file where the folder belongs: no write goes through, even as root
    rc, out = oomlab(root, "hint", "eval-graphs")
    assert rc == 2
    assert f"Cannot write {root}/.oomlab/state.json" in out
    assert "A file stands where a folder is needed" in out


def test_the_progress_bar_has_a_line_of_its_own(root):
    (root / ".oomlab").mkdir()
    (root / ".oomlab" / "state.json").write_text(json.dumps({"passed": {ids(root)[0]: "2025-01-01T00:00:00"}}))
    rc, out = oomlab(root, columns=80, raw=True)
    assert rc == 0
    lines = out.splitlines()
    bar = next(i for i, line in enumerate(lines) if f"1/{len(ids(root))} exercises passed" in line)
    assert "━" in lines[bar] and lines[bar + 1].strip() == ""  # the bar, its label, then a blank line
    assert lines[bar + 2].lstrip().startswith("✓ 1.")


def test_hint_says_when_it_shows_the_last_hint_again(root):
    outs = [oomlab(root, "hint", "feature-cache")[1] for _ in range(4)]
    assert "Hint 3 of 3" in outs[2] and "That is the last hint" in outs[2]
    assert "Hint 3 of 3" in outs[3] and "That was the last hint" in outs[3]
    assert "again for the next" not in outs[3]


def test_solution_wraps_long_lines_instead_of_cutting_them(root):
    (root / ".oomlab").mkdir()
    (root / ".oomlab" / "state.json").write_text(json.dumps({"passed": {"eval-graphs": "2025-01-01T00:00:00"}}))
    rc, out = oomlab(root, "solution", "eval-graphs", columns=60, raw=True)
    assert rc == 0
    flat = "".join(out.split())
    longest = max((REPO / "solutions" / "eval-graphs" / "train.py").read_text().splitlines(), key=len)
    assert len(longest) > 60 and "".join(longest.split()) in flat


@pytest.mark.parametrize("command", [[], ["hunt"], ["watch"], ["hint"], ["dev", "verify"]], ids=" ".join)
def test_help_shows_plain_placeholders(root, command):
    rc, out = oomlab(root, *command, "--help")
    assert rc == 0
    assert not re.search(r"<(bool|str|list\[str\]|float|int|path)>", out), out
    if command == ["hunt"]:
        assert "Usage: oomlab hunt [OPTIONS] TARGET..." in out
        assert "--budget SIZE" in out and "--out FOLDER" in out and "--time-limit SECONDS" in out


def test_a_very_long_argument_is_a_clear_and_short_message(root, tmp_path):
    long = "a" * 5000
    rc, out = oomlab(root, "hint", long)
    assert rc == 2 and "There is no exercise" in out and "(5,000 characters)" in out and len(out) < 1000
    rc, out = oomlab(root, "init", str(tmp_path / long))
    assert rc == 2 and "File name too long" in out and len(out) < 1000


@pytest.mark.parametrize("columns", [80, 100])
def test_ids_and_commands_are_never_cut_or_run_together(root, columns):
    """An id or a command is copied into the next command: at 80 columns it stays whole, apart from its words."""
    every = ids(root)
    rc, out = oomlab(root, "list", columns=columns, raw=True)
    assert rc == 0
    words = out.split()
    assert all(ex_id in words for ex_id in every), [e for e in every if e not in words]
    assert "status" in words, "every column still shows"
    rc, out = oomlab(root, columns=columns, raw=True)
    lines = out.splitlines()
    for command in (f"oomlab run {every[0]}", f"oomlab check {every[0]}", "oomlab watch"):
        line = next((line for line in lines if command in line), "")
        assert re.search(rf"{re.escape(command)}\s{{2,}}\S", line), (command, out)  # whole, then room, then its words


@pytest.mark.parametrize("command", ["check", "run"])  # a run comes before a check: it keeps one too
@pytest.mark.parametrize(
    "args,declared,kept",
    [
        (["--keep-warm"], False, ""),
        (["--keep-warm"], True, "expandable_segments:True"),
        ([], False, None),  # OOMLAB_KEEP_WARM=0 in the environment, as a learner's may say
        (["--no-keep-warm"], False, None),
    ],
    ids=["manifest-settings", "script-sets-its-own", "env-says-no", "option-says-no"],
)
def test_a_check_or_run_keeps_a_server_warm_for_the_settings_its_run_started_with(
    root, monkeypatch, capsys, command, args, declared, kept
):
    from oomlab.cli import learner, main
    from oomlab.grading.verdict import Report
    from oomlab.measure import harness, keeper
    from oomlab.measure.harness import Measurement

    monkeypatch.setenv("OOMLAB_KEEP_WARM", "0")
    started = []
    m = Measurement(script="train.py", status="ok", alloc_conf="expandable_segments:True" if declared else "")
    m.alloc_conf_declared = declared
    monkeypatch.setattr(learner, "grade_and_show", lambda ex, progress: Report(ex, m, None, []))
    monkeypatch.setattr(harness, "measure_exercise_file", lambda ex, path, sandboxed: m)
    monkeypatch.setattr(learner, "refuse_without_a_driver", lambda path, doing: None)
    monkeypatch.setattr(learner, "has_nvidia_driver", lambda: True)
    monkeypatch.setattr(keeper, "keep_warm", lambda root, conf: started.append(conf) or True)
    with pytest.raises(SystemExit) as done:
        main([command, *args, "eval-graphs"])
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0, out
    assert started == ([] if kept is None else [kept])
    assert ("your next run or check costs the script, not the imports" in out) is (kept is not None), out
