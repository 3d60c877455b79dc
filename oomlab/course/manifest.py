"""Reading ``exercises/<id>/exercise.toml``: one exercise's single source of truth.

The buggy script, its reference fix, the tempting wrong fixes and the accepted
alternative fixes (both as edits of the buggy script), the hints, the interview
question, the budget and the checks all hang off this file; the CLI, the pytest
graders, ``oomlab dev verify`` and the site pages are derived from it.
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
    step: str
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
    step = _require(data, "step", str, manifest)
    if step not in STEP_NAMES:
        raise OomLabError(f"{manifest}: step {step!r} is not one of {', '.join(STEP_NAMES)}.", "Use one of those.")
    budget = _require(data, "budget_bytes", int, manifest)
    if budget <= 0:
        raise OomLabError(f"{manifest}: budget_bytes must be positive.", "Set the memory budget in bytes.")
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

    wrong_fixes = [_edit_fix(entry, manifest, "wrong_fixes", checks) for entry in data.get("wrong_fixes", [])]
    if not wrong_fixes:
        raise OomLabError(
            f"{manifest}: no [[wrong_fixes]].", "Add at least one tempting fix the grader rejects, with the reason."
        )
    alternatives = [_edit_fix(entry, manifest, "alternatives", checks) for entry in data.get("alternatives", [])]
    names = [f.name for f in (*wrong_fixes, *alternatives)]
    if len(set(names)) != len(names):
        raise OomLabError(f"{manifest}: two wrong fixes or alternatives share a name.", "Name each one differently.")

    return Exercise(
        id=ex_id,
        title=_require(data, "title", str, manifest),
        module=module,
        step=step,
        file=_require(data, "file", str, manifest),
        budget_bytes=budget,
        alloc_conf=_require(data, "alloc_conf", str, manifest) if "alloc_conf" in data else "",
        learner_settings=_require(data, "learner_settings", bool, manifest) if "learner_settings" in data else False,
        time_limit_s=_require(data, "time_limit_s", float, manifest),
        long_check=" ".join(_require(data, "long_check", str, manifest).split()) if "long_check" in data else "",
        symptom=symptom,
        summary=" ".join(_require(data, "summary", str, manifest).split()),  # one paragraph, wrapped by whoever shows it
        hints=tuple(h.strip() for h in hints),
        interview=Interview(" ".join(question.split()), answer.strip()),
        checks=checks,
        wrong_fixes=tuple(wrong_fixes),
        alternatives=tuple(alternatives),
        root=root,
        manifest_path=manifest,
        solution_path=(solutions or root / "solutions") / ex_id / _require(data, "file", str, manifest),
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
