"""The sandbox of a graded run, on CPU: the policy's rules on a fake file system, and Landlock itself where the kernel has it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oomlab.measure import confine, sandbox
from oomlab.measure.sandbox import FILE_RIGHTS, READ, TRUNCATE, WRITE, Policy

TREE = {
    "/": ["bin", "course", "tmp", "dev"],
    "/course": ["exercises", "solutions", ".oomlab", "README.md"],
    "/course/exercises": ["a", "b"],
    "/tmp": ["run", "other"],
    "/tmp/run": ["spec.json", "work"],
}
FILES = {"/course/README.md", "/tmp/run/spec.json"}


def fake_children(folder: str):
    return [(f"{folder.rstrip('/')}/{name}", f"{folder.rstrip('/')}/{name}" not in FILES) for name in TREE.get(folder, [])]


def test_the_deepest_entry_decides_and_a_hidden_folder_wins_over_its_visible_twin():
    policy = Policy(
        hidden=("/course", "/tmp/run", "/same"), visible=("/course/exercises/a", "/same"), writable=("/tmp/run/work",)
    )
    assert policy.kind_of("/course/solutions/a/train.py") == "hidden"
    assert policy.kind_of("/course/exercises/a/train.py") == "visible"
    assert policy.kind_of("/course/exercises/b/train.py") == "hidden"
    assert policy.kind_of("/tmp/run/spec.json") == "hidden"
    assert policy.kind_of("/tmp/run/work/x") == "writable"
    assert policy.kind_of("/usr/lib/python3") == "visible"  # under no entry: readable
    assert policy.kind_of("/same/x") == "hidden"
    assert policy.kind_of("/courseware") == "visible"  # a sibling whose name starts alike is not inside


def test_rules_grant_the_siblings_of_what_is_hidden_and_nothing_beneath_it():
    policy = Policy(hidden=("/course", "/tmp/run"), visible=("/course/exercises/a",), writable=("/tmp/run/work", "/dev"))
    rules = {path: (rights, is_dir) for path, rights, is_dir in sandbox.grants(policy, fake_children)}
    assert rules == {
        "/bin": (READ, True),
        "/course/exercises/a": (READ, True),
        "/tmp/run/work": (READ | WRITE | TRUNCATE, True),
        "/tmp/other": (READ, True),
        "/dev": (READ | WRITE | TRUNCATE, True),
    }
    # A file directly in a folder that is split gets a rule of file rights alone, which Landlock requires.
    rules = sandbox.grants(Policy(hidden=("/course/solutions",)), fake_children)
    readme = next(r for r in rules if r[0] == "/course/README.md")
    assert readme[1] == READ & FILE_RIGHTS and readme[2] is False
    assert not any(r[0].startswith("/course/solutions") for r in rules)


def test_a_graded_run_may_not_read_the_course_or_the_harness_but_may_read_its_own_folder_and_python(tmp_path):
    course = tmp_path / "course"
    script = course / "exercises" / "ex" / "train.py"
    run_dir, work = tmp_path / "run", tmp_path / "run" / "work"
    policy = confine.grading_policy(script, run_dir, work, course, hide=(tmp_path / "class",))
    for hidden in (
        course / "solutions" / "ex" / "train.py",
        course / ".oomlab" / "reference" / "r.json",
        course / ".git" / "HEAD",
    ):
        assert policy.kind_of(str(hidden)) == "hidden", hidden
    assert policy.kind_of(str(run_dir / "result.json")) == "hidden"
    assert policy.kind_of(str(tmp_path / "class" / "gradebook.db")) == "hidden"
    assert policy.kind_of(str(script)) == "visible"
    assert policy.kind_of(str(work / "ckpt.pt")) == "writable"
    assert policy.kind_of(sys.executable) != "hidden"
    assert policy.kind_of(str(Path(confine.__file__))) == "visible"  # the harness's own code
    assert policy.kind_of(str(Path(confine.__file__).parents[1] / "_course" / "solutions" / "x.py")) == "hidden"


PROBE = """
import json, os, sys
from oomlab.measure import sandbox

hidden, visible, work = sys.argv[1:4]
abi = sandbox.apply(sandbox.Policy(hidden=(hidden,), visible=(visible,), writable=(work,)))
seen = {"abi": abi}
for name, act in {
    "read hidden": lambda: open(os.path.join(hidden, "answer.txt")).read(),
    "write hidden": lambda: open(os.path.join(hidden, "new.txt"), "w").write("x"),
    "read visible inside hidden": lambda: open(os.path.join(visible, "train.py")).read(),
    "write visible": lambda: open(os.path.join(visible, "new.txt"), "w").write("x"),
    "write work": lambda: open(os.path.join(work, "new.txt"), "w").write("x"),
    "read work": lambda: open(os.path.join(work, "new.txt")).read(),
    "list hidden": lambda: os.listdir(hidden),
    "read through /proc": lambda: open(f"/proc/{os.getppid()}/cwd/answer.txt").read(),
    "child reads hidden": lambda: __import__("subprocess").run(["cat", os.path.join(hidden, "answer.txt")], check=True, capture_output=True),
    "import json.tool": lambda: __import__("json.tool"),
}.items():
    try:
        act()
        seen[name] = "allowed"
    except Exception as err:
        seen[name] = type(err).__name__
print(json.dumps(seen))
"""


def test_landlock_keeps_a_process_and_its_children_from_what_is_hidden(tmp_path):
    abi, why = sandbox.availability()
    if not abi:
        pytest.skip(f"no Landlock here: {why}")
    hidden = tmp_path / "course"
    visible = hidden / "exercises" / "ex"
    work = tmp_path / "work"
    for folder in (visible, work):
        folder.mkdir(parents=True)
    (hidden / "answer.txt").write_text("42")
    (visible / "train.py").write_text("print('hi')")
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(PROBE))
    repo = Path(sandbox.__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(probe), str(hidden), str(visible), str(work)],
        cwd=hidden,  # the parent's folder is the hidden one: /proc/PARENT/cwd must not lead into it
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["abi"] == abi
    assert seen["read hidden"] == seen["write hidden"] == "PermissionError"
    assert seen["read through /proc"] == "PermissionError"
    assert seen["child reads hidden"] == "CalledProcessError"  # the restriction is inherited
    assert seen["write visible"] == "PermissionError"
    for allowed in ("read visible inside hidden", "write work", "read work", "list hidden", "import json.tool"):
        assert seen[allowed] == "allowed", allowed


def test_a_process_already_running_threads_is_not_sandboxed_half_way(tmp_path):
    abi, why = sandbox.availability()
    if not abi:
        pytest.skip(f"no Landlock here: {why}")
    code = textwrap.dedent(
        """
        import threading, time
        from oomlab.measure import sandbox
        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
        try:
            sandbox.apply(sandbox.Policy(hidden=("/nonexistent",)))
        except sandbox.Unavailable as err:
            print("refused:", err)
        """
    )
    repo = Path(sandbox.__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(repo)}, timeout=60)
    assert out.stdout.startswith("refused:") and "threads" in out.stdout, out.stdout + out.stderr
