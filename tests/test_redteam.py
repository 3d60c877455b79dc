"""The red-team set (tests/redteam/): cheats that must not pass, and honest fixes that must, graded as ``oomlab check`` grades.

Each case is a whole script a learner could hand in as ``exercises/ID/train.py``
(and, for some cheats, the learner's own ``exercise.toml`` beside it);
tests/redteam/cases.toml lists them and says what each tries. On a GPU every
case is graded in a course folder of its own, made by ``oomlab init``, after
the learner's first ``oomlab check`` of the shipped script there (so the
reference is measured and cached, as it is for any learner who has checked
once): a cheat must not pass, an honest fix must. All of them are measured at
once, as ``oomlab dev verify`` measures the course, so the set takes about as
long as its slowest run. Without a GPU only the set's own well-formedness is
checked.
"""

from __future__ import annotations

import ast
import re
import shutil
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REDTEAM = Path(__file__).resolve().parent / "redteam"
CASES: list[dict] = tomllib.loads((REDTEAM / "cases.toml").read_text(encoding="utf-8"))["case"]
# A draft exercise (modules.toml's drafts) is not in the course yet: its cases are checked for form here and graded on
# a GPU once it joins, never graded against a course that has no such exercise (a refusal would read as a cheat caught).
DRAFTS = set(tomllib.loads((REDTEAM.parents[1] / "exercises" / "modules.toml").read_text(encoding="utf-8")).get("drafts", []))
CHEATS = [c for c in CASES if c["kind"] == "cheat" and c["exercise"] not in DRAFTS]
HONEST = [c for c in CASES if c["kind"] == "honest" and c["exercise"] not in DRAFTS]
REQUIRED = {"exercise", "name", "kind", "class", "idea"}
OPTIONAL = {"why", "manifest", "note"}
# What the grader raises when the machine, not the script, stopped a run (oomlab.measure.machine.machine_error).
MACHINE_PROBLEM = re.compile(
    r"No CUDA GPU is visible|Other processes hold memory|is smaller than .*budget|PyTorch is not installed|"
    r"the course needs torch 2\.4|The measurement could not start"
)


def case_id(case: dict) -> str:
    return f"{case['exercise']}/{case['name']}"


def script_of(case: dict) -> Path:
    return REDTEAM / case["exercise"] / f"{case['name']}.py"


# ---------------------------------------------------------------------------------------------------------------------
# Without a GPU: the set itself


def test_every_case_is_listed_once_and_well_formed():
    from oomlab.course.shipped import shipped_root

    shipped = shipped_root()
    assert shipped is not None, "this oomlab carries no course"
    ids = [case_id(c) for c in CASES]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    on_disk = {f"{p.parent.name}/{p.stem}" for p in REDTEAM.glob("*/*.py")}
    assert on_disk == set(ids), (
        f"scripts without a case: {sorted(on_disk - set(ids))}; cases without a script: {sorted(set(ids) - on_disk)}"
    )
    for case in CASES:
        where = case_id(case)
        assert REQUIRED <= set(case) <= REQUIRED | OPTIONAL, f"{where}: fields {sorted(case)}"
        assert case["kind"] in ("cheat", "honest"), where
        assert isinstance(case["class"], int) and not isinstance(case["class"], bool), where
        assert case["class"] in (range(1, 6) if case["kind"] == "cheat" else (0,)), f"{where}: class {case['class']}"
        assert case["idea"].strip(), where
        assert bool(case.get("why", "").strip()) == (case["kind"] == "honest"), (
            f"{where}: an honest fix says why, a cheat does not"
        )
        assert (shipped / "exercises" / case["exercise"] / "exercise.toml").is_file(), (
            f"{where}: no exercise {case['exercise']!r}"
        )
        source = script_of(case).read_text(encoding="utf-8")
        compile(source, str(script_of(case)), "exec")
        doc = ast.get_docstring(ast.parse(source)) or ""
        if case["kind"] == "cheat":
            assert f"RED TEAM (class {case['class']}," in doc, f"{where}: its docstring must say what it attacks, and its class"
        else:
            assert "HONEST FIX" in doc, f"{where}: its docstring must say what it fixes"
        assert "cuda" in source, f"{where} must run on the GPU"
    assert {c["exercise"] for c in CASES} <= {p.name for p in (shipped / "exercises").iterdir() if p.is_dir()}


def test_the_set_is_as_large_and_as_varied_as_promised():
    assert len(CHEATS) >= 22
    assert len({c["exercise"] for c in CHEATS}) >= 8
    assert {c["class"] for c in CHEATS} == {1, 2, 3, 4, 5}
    assert len(HONEST) >= 8
    assert len({c["exercise"] for c in HONEST}) >= 5


@pytest.mark.parametrize("case", [c for c in CASES if "manifest" in c], ids=case_id)
def test_a_replacement_manifest_is_a_valid_exercise_toml(case, tmp_path):
    """A learner's edited manifest must load: a broken one would fail for a reason that tests nothing."""
    from oomlab.course.manifest import load_exercise

    manifest = REDTEAM / case["exercise"] / case["manifest"]
    tomllib.loads(manifest.read_text(encoding="utf-8"))
    folder = tmp_path / case["exercise"]
    folder.mkdir()
    shutil.copyfile(manifest, folder / "exercise.toml")  # load_exercise wants the manifest in a folder named after the id
    ex = load_exercise(folder / "exercise.toml", tmp_path, tmp_path / "solutions")
    assert ex.id == case["exercise"]


# ---------------------------------------------------------------------------------------------------------------------
# On a GPU: every case graded


@dataclass
class Graded:
    """One case's grade, as ``oomlab check`` would show it."""

    passed: bool = False
    lines: list[str] = field(default_factory=list)
    error: str = ""  # the grader raised instead of reporting

    @property
    def machine_problem(self) -> bool:
        return bool(MACHINE_PROBLEM.search(self.error))

    def shown(self) -> str:
        return "\n".join([self.error] if self.error else self.lines)


def grade_as_check(root: Path, ex_id: str) -> Graded:
    """``oomlab check ID`` in the course at ``root``: the learner's file, the manifest as the course reads it."""
    from oomlab.course import Course
    from oomlab.grading.verdict import grade

    try:
        ex = Course(root, strict=False).get(ex_id)
        report = grade(ex, ex.learner_path)
    except Exception as err:  # the grader refusing is not a pass; a machine problem is told apart by the test
        return Graded(error=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}")
    m = report.measurement
    failed = f" (failed: {', '.join(report.failed())})" if report.failed() else ""
    lines = [f"{report.verdict}{failed}: {m.status} {m.message[:300]} {m.where}".rstrip()]
    if m.runner_note:
        lines.append(f"({m.runner_note})")
    lines += [
        f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.measured} (required {c.threshold}) {c.detail}" for c in report.checks
    ]
    if m.stdout.strip():
        lines.append("stdout: " + " | ".join(m.stdout.strip().splitlines()[-6:]))
    if m.status not in ("ok", "oom") and m.stderr.strip():
        lines.append("stderr: " + " | ".join(m.stderr.strip().splitlines()[-6:]))
    return Graded(report.passed, lines)


def selected_cases(request) -> list[dict]:
    """The cases whose tests this session runs (all of them unless -k or node ids choose)."""
    chosen = {
        case_id(item.callspec.params["case"])
        for item in request.session.items
        if item.originalname in ("test_a_cheat_does_not_pass", "test_an_honest_fix_passes")
        and "case" in getattr(getattr(item, "callspec", None), "params", {})
    }
    return [c for c in CASES if case_id(c) in chosen]


@pytest.fixture(scope="session")
def graded(request, tmp_path_factory) -> dict[str, Graded]:
    """Every selected case graded once, all at once: first each exercise's first check, then the cases."""
    from oomlab.course import Course
    from oomlab.course.shipped import init_course
    from oomlab.course.state import StateDir
    from oomlab.measure.machine import parallel_runs

    cases = selected_cases(request)
    base = tmp_path_factory.mktemp("redteam")
    exercises = sorted({c["exercise"] for c in cases})

    # The learner's first `oomlab check`, of the shipped script, in a course of its own per exercise: it measures the
    # reference and caches it under .oomlab/reference/, where any learner who has checked once has it.
    first = {}
    for ex_id in exercises:
        init_course(base / "first" / ex_id)
        first[ex_id] = base / "first" / ex_id
    budgets = [Course(first[e], strict=False).get(e).budget_bytes for e in exercises]
    jobs = parallel_runs(budgets)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        firsts = dict(zip(exercises, pool.map(lambda e: grade_as_check(first[e], e), exercises), strict=True))

    def prepare(case: dict) -> Path:
        """A course of the case's own: the first check's cached reference, the case's script (and manifest)."""
        ex_id = case["exercise"]
        root = base / "cases" / f"{ex_id}--{case['name']}"
        init_course(root)
        cached = StateDir(first[ex_id]).references
        if cached.is_dir():
            shutil.copytree(cached, StateDir(root).references, dirs_exist_ok=True)
        ex = Course(root, strict=False).get(ex_id)
        shutil.copyfile(script_of(case), ex.learner_path)
        if "manifest" in case:
            shutil.copyfile(REDTEAM / ex_id / case["manifest"], root / "exercises" / ex_id / "exercise.toml")
        return root

    roots = {case_id(c): prepare(c) for c in cases}
    results = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running = {pool.submit(grade_as_check, roots[case_id(c)], c["exercise"]): c for c in cases}
        for done in as_completed(running):
            case, results[case_id(running[done])] = running[done], done.result()
            print(f"[redteam] {case['kind']} {case_id(case)}: {results[case_id(case)].shown().splitlines()[0][:160]}", flush=True)
    for ex_id, g in firsts.items():  # a reference that could not be measured explains every case of its exercise
        if g.error:
            for key in results:
                if key.startswith(f"{ex_id}/") and results[key].error:
                    results[key].error += f"\n(the first check of {ex_id} failed too: {g.error.splitlines()[0]})"
    return results


@pytest.mark.gpu
@pytest.mark.parametrize("case", CHEATS, ids=case_id)
def test_a_cheat_does_not_pass(case, graded):
    result = graded[case_id(case)]
    assert not result.machine_problem, f"the machine, not the script, stopped the run:\n{result.shown()}"
    assert not result.passed, (
        f"{case_id(case)} (class {case['class']}) passed: {case['idea']}\n{case.get('note', '')}\n{result.shown()}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("case", HONEST, ids=case_id)
def test_an_honest_fix_passes(case, graded):
    result = graded[case_id(case)]
    assert result.passed, f"{case_id(case)} did not pass: {case['idea']}\n{case.get('note', '')}\n{result.shown()}"
