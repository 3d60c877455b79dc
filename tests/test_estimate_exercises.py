"""The exercises of kind "estimate" (size-a-training-step, size-a-decoder), on the CPU: their manifests, their truth
check end to end with the CPU's count standing in for the GPU, and `oomlab run` and `check` on them.

The GPU's measurement is the truth an estimate is graded on (``pytest graders --solutions`` and ``oomlab dev verify``
on a GPU); here the same configs are counted tensor by tensor (:mod:`oomlab.sizing.cpu_count`), on small configs
in place of the hidden ones, which take minutes to count on a CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import shutil
from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.course.manifest import load_exercise
from oomlab.errors import OomLabError
from oomlab.measure import sandbox

REPO = Path(__file__).resolve().parents[1]
ESTIMATES = ("size-a-training-step", "size-a-decoder")
TINY = {  # what `oomlab run` counts in the CLI's tests: a step or a generation of a second's tenth on the CPU
    "train": dict(layers=1, width=32, heads=2, sequence=16, batch=2, vocabulary=64),
    "decode": dict(layers=1, width=32, heads=4, kv_heads=2, prompt=8, new_tokens=4, batch=2, vocabulary=64),
}


def exercise(ex_id: str, root: Path = REPO):
    return Course(root, working_tree=True).get(ex_id)


def landlock():
    abi, why = sandbox.availability()
    if not abi:
        pytest.skip(f"no Landlock here: {why}")


# -- the manifest -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ex_id", ESTIMATES)
def test_an_estimate_exercise_sits_in_size_it_first_with_examples_and_wrong_fixes_that_name_a_part(ex_id):
    from oomlab.sizing.grade import SIZED

    ex = exercise(ex_id)
    assert ex.module.name == "size-it-first" and not ex.step
    assert ex.is_estimate and ex.file == "estimate.py" and ex.budget_bytes == 0 and not ex.checks
    assert ex.solution_path.is_file() and len(ex.hints) == 3 and len(ex.interview.answer.split()) >= 150
    kind = SIZED[ex.sizes]
    assert all(kind.parse(cfg) for cfg in ex.examples) and 2 <= len(ex.examples) <= 3
    assert {fix.expect for fix in ex.wrong_fixes} <= set(kind.parts)
    bug = ex.learner_path.read_text(encoding="utf-8")
    for fix in ex.wrong_fixes:
        compile(fix.apply(bug), fix.name, "exec")


def edited(tmp_path: Path, ex_id: str, find: str, replace: str) -> Path:
    """A copy of ``ex_id``'s folder whose manifest has ``find`` replaced (``find`` must be in it once)."""
    folder = tmp_path / "exercises" / ex_id
    shutil.copytree(REPO / "exercises" / ex_id, folder)
    manifest = folder / "exercise.toml"
    text = manifest.read_text(encoding="utf-8")
    assert text.count(find) == 1, find
    manifest.write_text(text.replace(find, replace), encoding="utf-8")
    return manifest


@pytest.mark.parametrize(
    "ex_id, find, replace, said",
    [
        ("size-a-decoder", 'kind = "estimate"', 'kind = "guess"', "kind 'guess' is not one of script, estimate"),
        ("size-a-decoder", 'sizes = "decode"', 'sizes = "serve"', "sizes 'serve' is not one of train, decode"),
        ("size-a-decoder", 'sizes = "decode"\n', "", "the key 'sizes' is missing"),
        ("size-a-decoder", 'file = "estimate.py"', 'file = "estimate.py"\nbudget_bytes = 1', "has no 'budget_bytes'"),
        ("size-a-decoder", 'file = "estimate.py"', 'file = "estimate.py"\nsymptom = "no_oom"', "has no 'symptom'"),
        ("size-a-decoder", 'file = "estimate.py"', 'file = "estimate.py"\nchecks = { no_oom = {} }', "has no 'checks'"),
        ("size-a-decoder", "kv_heads = 2\n", "kv_heads = 3\n", r"\[\[examples\]\] 1: .*must divide by its kv_heads \(3\)"),
        ("size-a-decoder", 'expect = "weights"', 'expect = "no_oom"', "expects 'no_oom', which is no part of"),
        ("size-a-decoder", "[[examples]]\nlayers = 4", "[nothing]\nlayers = 4", r"has 2 or 3 \[\[examples\]\], found 1"),
        ("size-a-decoder", 'file = "estimate.py"', 'file = "estimate.py"\nstep = "profile"', "has no 'step': nothing runs"),
    ],
    ids=["kind", "sizes", "no-sizes", "budget", "symptom", "checks", "bad-example", "expect-no-part", "examples", "step"],
)
def test_an_estimate_manifest_says_what_is_wrong_in_it(tmp_path, ex_id, find, replace, said):
    from oomlab.grading.estimates import validate

    manifest = edited(tmp_path, ex_id, find, replace)
    with pytest.raises(OomLabError, match=said):  # the manifest's form when it loads, the sizing's names before a run
        validate(load_exercise(manifest, tmp_path, REPO / "solutions"))


def test_a_script_exercise_says_an_estimators_keys_are_not_its_own(tmp_path):
    manifest = edited(tmp_path, "eval-graphs", 'file = "train.py"', 'file = "train.py"\nsizes = "train"')
    with pytest.raises(OomLabError, match="'sizes' belongs to an estimate exercise, and this one is a script"):
        load_exercise(manifest, tmp_path, REPO / "solutions")


# -- the truth check, the CPU standing in for the GPU -----------------------------------------------------------------

SMALL = {  # small configs of every kind the wrong fixes get wrong: each optimizer and precision, grouped heads, batches
    "train": [
        dict(
            layers=2,
            width=64,
            heads=4,
            sequence=64,
            batch=2,
            vocabulary=2000,
            precision="fp32",
            optimizer="adamw",
            checkpointing=False,
        ),
        dict(
            layers=3,
            width=64,
            heads=2,
            sequence=32,
            batch=4,
            vocabulary=500,
            precision="bf16-autocast",
            optimizer="sgd-momentum",
            checkpointing=True,
        ),
        dict(
            layers=1,
            width=128,
            heads=4,
            sequence=64,
            batch=1,
            vocabulary=4000,
            precision="bf16",
            optimizer="sgd",
            checkpointing=False,
        ),
    ],
    "decode": [
        dict(layers=2, width=64, heads=4, kv_heads=1, prompt=32, new_tokens=8, batch=2, vocabulary=500, precision="fp32"),
        dict(layers=2, width=64, heads=8, kv_heads=2, prompt=16, new_tokens=32, batch=4, vocabulary=300, precision="bf16"),
        dict(layers=1, width=128, heads=4, kv_heads=4, prompt=64, new_tokens=4, batch=1, vocabulary=2000, precision="fp32"),
    ],
}


@functools.cache
def counted(sizes: str, cfg) -> tuple:
    from oomlab.sizing.cpu_count import count_on_cpu
    from oomlab.sizing.grade import SIZED

    return tuple(count_on_cpu(SIZED[sizes], cfg).items())


@pytest.fixture
def cpu_for_gpu(monkeypatch):
    """Grading with the small configs in place of the hidden ones, each counted on the CPU in place of the GPU."""
    import oomlab.sizing.grade as grade

    for sizes, kind in grade.SIZED.items():
        small = [kind.parse(c) for c in SMALL[sizes]]
        monkeypatch.setitem(grade.SIZED, sizes, dataclasses.replace(kind, draw=lambda source, count, small=small: small))

    def measure(configs, module, time_limit_s=0):
        sizes = next(s for s, k in grade.SIZED.items() if k.module == module)
        return [dict(counted(sizes, c)) for c in configs], "the CPU", "counted"

    monkeypatch.setattr(grade, "measure_configs", measure)


@pytest.mark.parametrize("ex_id", ESTIMATES)
def test_the_truth_check_of_an_estimate_exercise_behaves_as_its_manifest_says(ex_id, course_copy, cpu_for_gpu):
    """The reference passes, the estimator as shipped fails, each wrong fix gets its own part wrong: end to end, each
    estimator in its sandbox, the report's rows as ``verify.json`` holds them."""
    pytest.importorskip("torch")
    landlock()
    from oomlab.grading import truth

    ex = exercise(ex_id, course_copy)
    runs = truth.variants(ex)
    assert [v.kind for v in runs] == ["solution", "bug", *["wrong-fix"] * len(ex.wrong_fixes)]
    measured = [truth.check_estimate(v) for v in runs]
    for (row, report), v in zip(measured, runs, strict=True):
        assert row["as_expected"], truth.explain_estimate(row, report)
        assert row["configs"] == 3 and row["total"] == 3 * len(report.sized.parts)
        if v.kind == "wrong-fix":
            assert v.expect <= set(row["failed_parts"]), (v.name, row["failed_parts"])
    row = truth.estimate_row(ex, [r for r, _ in measured], "the CPU", "counted")
    assert row["solution"]["verdict"] == "pass" and row["buggy"]["verdict"] == "fail" and truth.all_as_expected([row])
    assert row["sources"] == truth.source_digest(ex) and row["cheats"] == []
    assert row["code"] == truth.estimate_fingerprint() and truth.stale(row, ex) is None


# -- the learner's commands -------------------------------------------------------------------------------------------


def tiny(root: Path) -> Path:
    """``root``'s course with the estimate exercises' examples made tiny: counted on the CPU in a fraction of a second."""
    for ex_id, sizes in zip(ESTIMATES, ("train", "decode"), strict=True):
        manifest = root / "exercises" / ex_id / "exercise.toml"
        text = manifest.read_text(encoding="utf-8")
        first = text.index("[[examples]]")
        rest = text.index("[interview]")
        tiny = "".join(
            "[[examples]]\n" + "".join(f"{k} = {v}\n" for k, v in {**TINY[sizes], **dict(precision=f'"{p}"')}.items()) + "\n"
            for p in (("fp32", "bf16") if sizes == "decode" else ("fp32", "bf16-autocast"))
        )
        manifest.write_text(text[:first] + tiny + text[rest:], encoding="utf-8")
    return root


def cli_env(root: Path) -> dict:
    """The environment tests/test_cli.py runs the commands in."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")}
    return {**env, "OOMLAB_ROOT": str(root), "COLUMNS": "200", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}


def test_run_shows_the_estimate_beside_the_cpus_count_and_check_says_measuring_needs_a_gpu(course_copy):
    pytest.importorskip("torch")
    from oomlab.measure.machine import has_nvidia_driver
    from tests.forked_commands import oomlab_commands
    from tests.test_cli import oomlab

    root = tiny(course_copy)
    assert [e.id for e in Course(root, working_tree=True).exercises if e.is_estimate] == list(ESTIMATES)
    rc, out = oomlab(root, "list")
    assert rc == 0 and "size-a-training-step" in out and "none" in out, out

    rc, out = oomlab(root, "run", "size-a-decoder")
    assert rc == 0, out
    assert "Your estimate beside the CPU's count" in out and "no library workspace" in out, out
    assert out.count("kv_cache") == 2 and "1. layers=1, width=32" in out and "-100.0%" in out, out  # no cache at all
    # A config of the learner's own: the first example with the fields named set, counted beside the examples; the
    # examples are the course's, whatever the learner's copy of the manifest says.
    n = len(Course(root, working_tree=True).get("size-a-decoder").examples)
    manifest = root / "exercises" / "size-a-decoder" / "exercise.toml"
    manifest.write_text(manifest.read_text(encoding="utf-8").replace("[[examples]]", "[[examples]]\n# mine", 1))
    rc, out = oomlab(root, "run", "size-a-decoder", "--config", "layers=3, precision=fp32")
    assert rc == 0 and "The examples, then yours:" in out and out.count("kv_cache") == 3, out
    assert re.search(rf"{n + 1}\. layers=3, width=32, .*precision=fp32", out), out
    assert "the examples, tolerances and file come from the course" in out and "`oomlab run --config`" in out, out
    rc, out = oomlab(root, "run", "size-a-decoder", "--config", "depth=3")
    assert rc == 2 and "'depth=3' is not name=value with a field of the config" in out, out

    rc, out = oomlab(root, "check", "size-a-training-step")
    assert rc == 2, out
    if not has_nvidia_driver():
        assert "has no NVIDIA driver" in out and "measuring the 6 configs your estimate is graded on needs an NVIDIA GPU" in out

    estimator = root / "exercises" / "size-a-training-step" / "estimate.py"
    estimator.write_text("def estimate(config):\n    return 1 / 0\n", encoding="utf-8")
    # The estimator answers before anything is measured: its failure is said on any machine, with its last frames.
    proc = oomlab_commands.run(["check", "size-a-training-step"], root, cli_env(root), 120, program="oomlab")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "estimate() failed on config 1" in out and "ZeroDivisionError" in out, out
    rc, out = oomlab(root, "hint", "size-a-training-step")
    assert rc == 0 and "Hint 1 of 3" in out
    # Sized before anything runs: no step of the workflow, and no run for a tool to look at.
    assert "size it before it runs" in oomlab(root)[1]
    rc, out = oomlab(root, "snapshot", "size-a-training-step")
    assert rc == 2 and "size-a-training-step is sized before anything runs" in out and "oomlab run size-a-training-step" in out
    course = Course(root, working_tree=True)
    assert [ex.id for ex in course.scripts] == [ex.id for ex in course.exercises if ex.id not in ESTIMATES]


@pytest.mark.parametrize(
    "text, said",
    [
        ("layers=4, checkpointing=true", None),
        ("checkpointing=yes", "checkpointing is true or false, not 'yes'"),
        ("layers=four", "layers is a whole number, not 'four'"),
        ("layers", "'layers' is not name=value"),
        ("precision=fp8", "precision must be one of"),
        ("layers=12, width=1024, heads=8, sequence=2048, batch=8", "too large to count on the CPU"),
    ],
)
def test_a_learners_own_config_is_an_example_with_fields_set_checked_and_small_enough_to_count(text, said):
    from oomlab.sizing.cpu_count import own_config
    from oomlab.sizing.grade import SIZED

    base = dict(exercise("size-a-training-step").examples[0])
    if said is None:
        assert own_config(SIZED["train"], base, text) == {**base, "layers": 4, "checkpointing": True}
    else:
        with pytest.raises(OomLabError, match=re.escape(said)):
            own_config(SIZED["train"], base, text)


# -- the site ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ex_id", ESTIMATES)
def test_the_page_of_an_estimate_exercise_shows_the_task_its_tolerances_and_examples_and_no_budget(ex_id):
    pytest.importorskip("mkdocs")
    from oomlab.grading.estimates import parts_of
    from oomlab.site.exercise_page import exercise_page
    from oomlab.site.reports import Reports

    ex = exercise(ex_id)
    page = exercise_page(ex, 1, 1, Reports(exercises=[ex]))
    assert f"# {ex.title}" in page and "Memory budget | none" in page and "PYTORCH_CUDA_ALLOC_CONF" not in page
    assert all(f"| `{part}` | ±" in page for part in parts_of(ex)) and "## Example configs" in page
    assert all(f"`{fix.name}`: gets `{fix.expect}` wrong" in page for fix in ex.wrong_fixes)
    assert "## Hints" in page and "## In an interview" in page and "def estimate(config):" in page
    # The learner's folder holds no copy of the model: the page shows the code the grader runs, as it is.
    from oomlab.sizing.grade import SIZED

    kind = SIZED[ex.sizes]
    assert "## What you size" in page and f"python -m inspect {kind.model}" in page
    model = importlib.import_module(kind.model)
    assert inspect.getsource(model).strip() in page
    assert inspect.getsource(getattr(importlib.import_module(kind.module), kind.function)).strip() in page


def test_equivalence_forks_no_estimator_and_its_truth_check_half_grades_each_estimate_once(monkeypatch):
    """An estimate runs no script to fork: the table has no row of it, the verify report its one graded row, which
    also says the GPU a sitting of estimates alone was measured on."""
    from oomlab.grading import equivalence, truth

    ex = exercise("size-a-decoder")
    runs = [
        {"name": v.name, "kind": v.kind, "verdict": "fail", "as_expected": True, "failed_parts": sorted(v.expect)}
        for v in truth.variants(ex)
    ]
    graded = []
    monkeypatch.setattr(equivalence, "run_all", lambda runs, *args, **kwargs: ({}, []) if not runs else pytest.fail("ran"))
    monkeypatch.setattr(
        equivalence,
        "check_estimates",
        lambda exercises, note: (
            graded.extend(exercises) or {e.id: truth.estimate_row(e, runs, "H200", "2.11") for e in exercises}
        ),
    )
    table, verified = equivalence.compare([ex])
    assert table["rows"] == [] and graded == [ex]
    assert [row["id"] for row in verified["exercises"]] == [ex.id] and (verified["gpu"], verified["torch"]) == ("H200", "2.11")
    assert verified["runs"] == len(runs), "an estimate's runs, and no reference"


def test_the_measurements_page_shows_an_estimators_parts_where_a_script_shows_its_peaks():
    pytest.importorskip("mkdocs")
    from oomlab.grading import truth
    from oomlab.site.measurements_page import measurements_page
    from oomlab.site.reports import Reports

    ex = exercise("size-a-decoder")
    runs = [
        {"name": v.name, "kind": v.kind, "verdict": "fail", "within": 10, "total": 18, "failed_parts": sorted(v.expect)[:1]}
        for v in truth.variants(ex)
    ]
    runs[0].update(verdict="pass", within=18, failed_parts=[])
    row = truth.estimate_row(ex, runs, "H200", "2.11")
    page = measurements_page(Reports(exercises=[ex], verify={"gpu": "H200", "torch": "2.11", "exercises": [row]}))
    assert "No budget: each estimator is graded on hidden configs" in page and "Budget" not in page
    assert "| reference solution | pass | 18 of 18 | none |" in page
    fix = ex.wrong_fixes[0]
    assert f"| wrong fix: {fix.name} | fail | 10 of 18 | `{fix.expect}` |" in page and "| Peak allocated" not in page


def test_a_draft_is_verified_by_its_id_and_its_runs_are_shown_not_written(course_copy, monkeypatch, capsys):
    """Before a draft joins the course its truth check runs as the course's does, and the report, which describes
    the course, is left alone; drafts and the course's exercises are never mixed in one sitting."""
    from oomlab.grading import truth
    from tests.in_process import oomlab
    from tests.test_modules import LIST, add_draft

    monkeypatch.setenv("OOMLAB_ROOT", str(course_copy))
    report_path = course_copy / "course" / "measurements" / "verify.json"  # the copy has none: none is written
    modules = course_copy / LIST  # the decoder taken out of its module and listed as a draft
    modules.write_text(modules.read_text(encoding="utf-8").replace('    "size-a-decoder",\n', "", 1), encoding="utf-8")
    add_draft(course_copy, "size-a-decoder")
    assert Course(course_copy).drafts[0] == "size-a-decoder"  # first, whatever drafts the course has besides

    def verified(exercises, note, jobs, fresh):
        rows = []
        for ex in exercises:
            runs = [
                {
                    "name": v.name,
                    "kind": v.kind,
                    "verdict": "fail",
                    "within": 1,
                    "total": 2,
                    "failed_parts": sorted(v.expect)[:1],
                    "expected_failure": sorted(v.expect) or None,
                    "as_expected": v.kind != "solution",
                }
                for v in truth.variants(ex)
            ]
            rows.append(truth.estimate_row(ex, runs, "H200", "2.11"))
        return {"gpu": "H200", "torch": "2.11", "exercises": rows, "ok": False, "runs": 1, "wall_s": 1.0, "runner": "forked"}

    monkeypatch.setattr(truth, "verify", verified)
    rc, said = oomlab(capsys, "dev", "verify", "--exercise", "size-a-decoder", "--jobs", "1")
    assert rc == 1 and "verify on H200" in said and "Not written to course/measurements/verify.json" in said, said
    assert "Not every run of the drafts as expected" in said and not report_path.exists()
    rc, said = oomlab(capsys, "dev", "verify", "--exercise", "size-a-decoder", "--exercise", "eval-graphs")
    assert rc == 2 and "Verify the drafts in one sitting and the course's exercises in another" in said, said
