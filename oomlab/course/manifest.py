"""Reading ``exercises/<id>/exercise.toml``: one exercise's single source of truth.

The buggy script, its reference fix, the tempting wrong fixes and the accepted
alternative fixes (both as edits of the buggy script), the hints, the interview
question, the budget and the checks all hang off this file; the CLI, the pytest
graders, ``oomlab dev verify`` and the site pages are derived from it.

An exercise is of one of two kinds (``kind``, :data:`KINDS`):

- ``script`` (the default, and every exercise that names no kind): a training script with a
  memory bug, run under a budget and graded by its ``[checks]`` against the reference fix;
- ``estimate``: a file whose ``estimate(config)`` returns the bytes of each part of what
  ``sizes`` names (a training step, a generation: :data:`oomlab.sizing.grade.SIZED`), graded
  on hidden configs measured on the GPU, each part within its tolerance. Nothing of it runs
  under a budget, so it has none of :data:`SCRIPT_ONLY`; it has two or three public
  ``[[examples]]`` configs instead (``oomlab run`` sets its answers for them beside the
  CPU's count), and each wrong fix ``expect``s the part it gets wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oomlab.course.toml_file import read_toml
from oomlab.errors import OomLabError
from oomlab.steps import STEPS
from oomlab.units import MIB

if TYPE_CHECKING:
    from oomlab.course.modules import Module

MANIFEST = "exercise.toml"  # each exercise folder's manifest
STEP_NAMES = tuple(s.name for s in STEPS)
HINTS = 3  # a nudge, which tool to use and what to look at, what to change
KINDS = ("script", "estimate")
# The keys of a script exercise that an estimate exercise must not have, each with why: it runs nothing under a budget.
SCRIPT_ONLY = {
    "step": "nothing runs, so no step of the workflow finds what it sizes: it is sized before anything runs",
    "budget_bytes": "nothing runs under a budget: each config is measured as it is",
    "alloc_conf": "the configs are measured by the course's code with the allocator's defaults",
    "learner_settings": "the learner's code sets no allocator settings: it only computes",
    "time_limit_s": "the estimator's time limit is the sandbox's (oomlab.sizing.sandboxed)",
    "long_check": "its check takes the time the configs' measuring takes",
    "symptom": "the estimate as shipped fails a part of some config: there is no check to name",
    "checks": "each part of each config is scored against its tolerance (oomlab.sizing.score)",
}
ESTIMATE_ONLY = ("sizes", "examples")  # and the keys a script exercise must not have
EXAMPLES = (2, 3)  # the fewest and the most public example configs of an estimate exercise


# How long a learner should have to wait for `oomlab check`, in seconds; an exercise whose check takes longer
# says why in its long_check (its page shows it, and `oomlab dev bench` judges the target by it).
CHECK_WAIT_S = 15


@dataclass(frozen=True)
class Edit:
    find: str
    replace: str


@dataclass(frozen=True)
class WrongFix:
    """A fix a learner is tempted to try (or, with ``expect`` empty, an honest alternative), as edits of the buggy script."""

    name: str
    expect: str  # the check that must catch it; "" for an accepted alternative, which must pass
    why: str
    edits: tuple[Edit, ...]
    manifest: Path | None = None  # the exercise.toml it comes from, named when an edit no longer matches

    def apply(self, source: str, where: str = "the buggy script") -> str:
        for edit in self.edits:
            count = source.count(edit.find)
            if count != 1:
                raise OomLabError(
                    f"{'Alternative' if not self.expect else 'Wrong fix'} {self.name!r}: its edit expects to find {edit.find!r} exactly once "
                    f"in {where}, found it {count} times.",
                    f"Update the edit in {self.manifest or 'exercise.toml'} to match the script.",
                )
            source = source.replace(edit.find, edit.replace)
        return source


@dataclass(frozen=True)
class Interview:
    question: str
    answer: str  # a model answer, about two minutes spoken


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    step: str  # the workflow step whose tool finds the bug; "" for an estimate exercise, which runs nothing
    file: str
    budget_bytes: int
    alloc_conf: str
    learner_settings: bool  # the script may set the allocator's settings itself: here that is the fix
    time_limit_s: float
    symptom: str
    summary: str
    hints: tuple[str, ...]
    interview: Interview
    checks: dict[str, dict] = field(hash=False)
    wrong_fixes: tuple[WrongFix, ...]
    alternatives: tuple[WrongFix, ...]  # other honest fixes, each verified to pass
    root: Path  # the course folder the learner works in
    # The manifest read. For the learner's commands, the shipped one, whatever the learner's copy says
    # (oomlab.course.originals.original_manifest); for a maintainer's, exercises/ID/exercise.toml itself.
    manifest_path: Path
    solution_path: Path  # the reference fix: beside the exercises in a checkout, in the package otherwise
    manifest_edited: bool = False  # the learner's exercise.toml differs from manifest_path, which was read instead
    # Its module, as the course's list (exercises/modules.toml) says: the manifest does not name it. None for a
    # manifest loaded on its own, outside a course.
    module: Module | None = None
    # Why `oomlab check` takes longer than a learner should wait (CHECK_WAIT_S) here, where it does: said on its page.
    long_check: str = ""
    kind: str = "script"  # one of KINDS
    sizes: str = ""  # an estimate exercise's: what its estimate() sizes, a key of oomlab.sizing.grade.SIZED
    examples: tuple[dict, ...] = field(default=(), hash=False)  # an estimate exercise's public configs, each as a dict

    @property
    def is_estimate(self) -> bool:
        """The learner writes ``estimate(config)``, graded part by part on hidden configs: no script runs."""
        return self.kind == "estimate"

    @property
    def learner_path(self) -> Path:
        """The file the learner edits."""
        return self.root / "exercises" / self.id / self.file

    @property
    def learner_manifest(self) -> Path:
        """The learner's copy of the manifest: shown to them, never graded with."""
        return self.root / "exercises" / self.id / MANIFEST

    @property
    def budget_mib(self) -> float:
        return self.budget_bytes / MIB


def _require(table: dict, key: str, kind: type, where: Path):
    if key not in table:
        raise OomLabError(f"{where}: the key {key!r} is missing.", "Compare with another exercise.toml.")
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise OomLabError(
            f"{where}: {key!r} should be a {kind.__name__}, found {type(value).__name__} {value!r}.",
            "Fix the value in exercise.toml.",
        )
    return value


def load_exercise(manifest: Path, root: Path, solutions: Path | None = None, module: Module | None = None) -> Exercise:
    """Parse and validate one manifest; every problem becomes one clear OomLabError.

    ``root`` is the course folder the learner works in; ``solutions`` the folder
    of reference fixes (default: ``root/solutions``); ``module`` the one the
    course's list puts it in (:class:`oomlab.course.Course` passes it).
    """
    try:
        return _load(manifest, root, solutions, module)
    except (TypeError, AttributeError, KeyError, ValueError) as err:  # a table where a list belongs, and the like
        raise OomLabError(
            f"{manifest} is not shaped like an exercise.toml: {type(err).__name__}: {err}.",
            "Compare it with another exercise.toml.",
        ) from None


def _load(manifest: Path, root: Path, solutions: Path | None, module: Module | None) -> Exercise:
    data = read_toml(manifest, "Every exercise folder needs an exercise.toml.")

    folder = manifest.parent.name
    ex_id = _require(data, "id", str, manifest)
    if ex_id != folder:
        raise OomLabError(f"{manifest}: id {ex_id!r} does not match its folder {folder!r}.", "Make them the same.")
    kind = _require(data, "kind", str, manifest) if "kind" in data else "script"
    if kind not in KINDS:
        raise OomLabError(
            f"{manifest}: kind {kind!r} is not one of {', '.join(KINDS)}.",
            'Leave it out for a training script with a memory bug, or write kind = "estimate" for an estimator.',
        )
    step = ""  # an estimate's: it is sized before anything runs, so no step of the workflow finds it
    if kind == "script":
        step = _require(data, "step", str, manifest)
        if step not in STEP_NAMES:
            raise OomLabError(f"{manifest}: step {step!r} is not one of {', '.join(STEP_NAMES)}.", "Use one of those.")
    hints = _require(data, "hints", list, manifest)
    if len(hints) != HINTS or not all(isinstance(h, str) and h.strip() for h in hints):
        raise OomLabError(
            f"{manifest}: hints must be a list of {HINTS} non-empty strings, found {len(hints)} entries.",
            "Write three hints: a nudge, which tool to use and what to look at, what to change.",
        )
    interview = _require(data, "interview", dict, manifest)
    question = _require(interview, "question", str, f"{manifest}: [interview]")
    answer = _require(interview, "answer", str, f"{manifest}: [interview]")
    if not question.strip() or not answer.strip():
        raise OomLabError(f"{manifest}: [interview] needs a question and a model answer.", "Write both.")

    # What every kind has, read and checked above; the rest is the kind's own.
    known = {
        "id": ex_id,
        "module": module,
        "step": step,
        "hints": tuple(h.strip() for h in hints),
        "interview": Interview(" ".join(question.split()), answer.strip()),
        "root": root,
        "manifest_path": manifest,
    }
    if kind == "estimate":
        return _load_estimate(data, manifest, solutions, known)
    for key in ESTIMATE_ONLY:
        if key in data:
            raise OomLabError(
                f"{manifest}: {key!r} belongs to an estimate exercise, and this one is a script.",
                f'Take {key!r} out, or write kind = "estimate" if the learner writes an estimator.',
            )
    budget = _require(data, "budget_bytes", int, manifest)
    if budget <= 0:
        raise OomLabError(f"{manifest}: budget_bytes must be positive.", "Set the memory budget in bytes.")
    checks = _require(data, "checks", dict, manifest)
    for name, params in checks.items():  # which checks exist, and their parameters, is the grader's to say
        if not isinstance(params, dict):  # (oomlab.grading.checks.validate, before anything is measured)
            raise OomLabError(f"{manifest}: [checks.{name}] must be a table.", "Write it as [checks.NAME].")
    symptom = _require(data, "symptom", str, manifest)
    if symptom not in checks:
        raise OomLabError(
            f"{manifest}: symptom {symptom!r} is not one of this exercise's checks.",
            "Name the check the seeded bug fails.",
        )

    wrong_fixes, alternatives = _fixes(data, manifest, checks)

    return Exercise(
        **known,
        title=_require(data, "title", str, manifest),
        file=_require(data, "file", str, manifest),
        budget_bytes=budget,
        alloc_conf=_require(data, "alloc_conf", str, manifest) if "alloc_conf" in data else "",
        learner_settings=_require(data, "learner_settings", bool, manifest) if "learner_settings" in data else False,
        time_limit_s=_require(data, "time_limit_s", float, manifest),
        long_check=" ".join(_require(data, "long_check", str, manifest).split()) if "long_check" in data else "",
        symptom=symptom,
        summary=" ".join(_require(data, "summary", str, manifest).split()),  # one paragraph, wrapped by whoever shows it
        checks=checks,
        wrong_fixes=wrong_fixes,
        alternatives=alternatives,
        solution_path=(solutions or root / "solutions") / ex_id / _require(data, "file", str, manifest),
    )


def _fixes(data: dict, manifest: Path, checks: dict) -> tuple[tuple[WrongFix, ...], tuple[WrongFix, ...]]:
    """The ``[[wrong_fixes]]`` (at least one) and ``[[alternatives]]``, each name once."""
    wrong_fixes = [_edit_fix(entry, manifest, "wrong_fixes", checks) for entry in data.get("wrong_fixes", [])]
    if not wrong_fixes:
        raise OomLabError(
            f"{manifest}: no [[wrong_fixes]].", "Add at least one tempting fix the grader rejects, with the reason."
        )
    alternatives = [_edit_fix(entry, manifest, "alternatives", checks) for entry in data.get("alternatives", [])]
    names = [f.name for f in (*wrong_fixes, *alternatives)]
    if len(set(names)) != len(names):
        raise OomLabError(f"{manifest}: two wrong fixes or alternatives share a name.", "Name each one differently.")
    return tuple(wrong_fixes), tuple(alternatives)


def _load_estimate(data: dict, manifest: Path, solutions: Path | None, known: dict) -> Exercise:
    """The rest of an estimate exercise's manifest: what it sizes, its public examples, wrong fixes that name a part.

    Which things can be sized, their configs' fields and their parts are the sizing's to say: they are checked by
    :func:`oomlab.grading.estimates.validate` before anything runs, as a script's checks are by the grader.
    """
    for key, why in SCRIPT_ONLY.items():
        if key in data:
            raise OomLabError(f"{manifest}: an estimate exercise has no {key!r}: {why}.", f"Take {key!r} out of {MANIFEST}.")
    sizes = _require(data, "sizes", str, manifest)
    examples = _require(data, "examples", list, manifest)
    if not EXAMPLES[0] <= len(examples) <= EXAMPLES[1]:
        raise OomLabError(
            f"{manifest}: an estimate exercise has {EXAMPLES[0]} or {EXAMPLES[1]} [[examples]], found {len(examples)}.",
            "Write public configs a learner can compare with the CPU's count (`oomlab run`), small enough to count in seconds.",
        )
    wrong_fixes, alternatives = _fixes(data, manifest, {})
    file = _require(data, "file", str, manifest)
    return Exercise(
        **known,
        title=_require(data, "title", str, manifest),
        file=file,
        budget_bytes=0,
        alloc_conf="",
        learner_settings=False,
        time_limit_s=0.0,
        symptom="",
        summary=" ".join(_require(data, "summary", str, manifest).split()),
        checks={},
        wrong_fixes=wrong_fixes,
        alternatives=alternatives,
        solution_path=(solutions or known["root"] / "solutions") / known["id"] / file,
        kind="estimate",
        sizes=sizes,
        examples=tuple(examples),
    )


def _edit_fix(entry: dict, manifest: Path, table: str, checks: dict) -> WrongFix:
    """One ``[[wrong_fixes]]`` entry (which names the check that catches it) or ``[[alternatives]]`` entry (which must pass)."""
    where = f"{manifest}: [[{table}]]"
    expect = ""
    if table == "wrong_fixes":
        expect = _require(entry, "expect", str, where)  # a check this exercise runs: grading.checks.validate
    edits = tuple(
        Edit(_require(e, "find", str, where), _require(e, "replace", str, where)) for e in _require(entry, "edits", list, where)
    )
    if not edits:
        raise OomLabError(f"{where} has no edits.", "A fix changes the buggy script somehow.")
    return WrongFix(_require(entry, "name", str, where), expect, _require(entry, "why", str, where), edits, manifest)
