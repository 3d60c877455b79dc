"""Reading ``exercises/<id>/exercise.toml``: one exercise's single source of truth.

The buggy script, its reference fix, the tempting wrong fixes (as edits of the
buggy script), the hints, the budget and the checks all hang off this file; the
CLI, the pytest graders, ``oomlab verify`` and the site pages are derived from it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from oomlab.errors import OomLabError
from oomlab.steps import STEPS
from oomlab.units import MIB

STEP_NAMES = tuple(s.name for s in STEPS)


@dataclass(frozen=True)
class Edit:
    find: str
    replace: str


@dataclass(frozen=True)
class WrongFix:
    """A fix a learner is tempted to try, written as edits of the buggy script."""

    name: str
    expect: str  # the check that must catch it
    why: str
    edits: tuple[Edit, ...]
    manifest: Path | None = None  # the exercise.toml it comes from, named when an edit no longer matches

    def apply(self, source: str, where: str = "the buggy script") -> str:
        for edit in self.edits:
            count = source.count(edit.find)
            if count != 1:
                raise OomLabError(
                    f"Wrong fix {self.name!r}: its edit expects to find {edit.find!r} exactly once "
                    f"in {where}, found it {count} times.",
                    f"Update the edit in {self.manifest or 'exercise.toml'} to match the script.",
                )
            source = source.replace(edit.find, edit.replace)
        return source


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    order: int
    step: str
    file: str
    budget_bytes: int
    alloc_conf: str
    time_limit_s: float
    symptom: str
    summary: str
    hints: tuple[str, ...]
    checks: dict[str, dict] = field(hash=False)
    wrong_fixes: tuple[WrongFix, ...]
    root: Path  # the course folder the learner works in
    manifest_path: Path  # the manifest read: the shipped one, whatever the learner's copy says
    solution_path: Path  # the reference fix: beside the exercises in a checkout, in the package otherwise

    @property
    def learner_path(self) -> Path:
        """The file the learner edits."""
        return self.root / "exercises" / self.id / self.file

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


def load_exercise(manifest: Path, root: Path, solutions: Path | None = None) -> Exercise:
    """Parse and validate one manifest; every problem becomes one clear OomLabError.

    ``root`` is the course folder the learner works in; ``solutions`` the folder
    of reference fixes (default: ``root/solutions``).
    """
    try:
        return _load(manifest, root, solutions)
    except (TypeError, AttributeError, KeyError, ValueError) as err:  # a table where a list belongs, and the like
        raise OomLabError(
            f"{manifest} is not shaped like an exercise.toml: {type(err).__name__}: {err}.",
            "Compare it with another exercise.toml.",
        ) from None


def _load(manifest: Path, root: Path, solutions: Path | None) -> Exercise:
    from oomlab.grading.checks import CHECKS  # the registry of check names

    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OomLabError(f"{manifest} does not exist.", "Every exercise folder needs an exercise.toml.") from None
    except tomllib.TOMLDecodeError as err:
        raise OomLabError(f"{manifest} is not valid TOML: {err}.", "Fix the syntax at the place named.") from None
    except UnicodeDecodeError as err:
        raise OomLabError(f"{manifest} is not UTF-8 text: {err.reason} at byte {err.start}.", "Save it as UTF-8.") from None
    except OSError as err:
        raise OomLabError(f"Cannot read {manifest}: {err.strerror or err}.", "Make it a readable file.") from None

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
    if not hints or not all(isinstance(h, str) and h.strip() for h in hints):
        raise OomLabError(f"{manifest}: hints must be a non-empty list of strings.", "Add at least one hint.")

    checks = _require(data, "checks", dict, manifest)
    for name, params in checks.items():
        if name not in CHECKS:
            raise OomLabError(f"{manifest}: unknown check {name!r}.", f"Known checks: {', '.join(sorted(CHECKS))}.")
        if not isinstance(params, dict):
            raise OomLabError(f"{manifest}: [checks.{name}] must be a table.", "Write it as [checks.NAME].")
        CHECKS[name].validate(params, where=f"{manifest}: [checks.{name}]")
    symptom = _require(data, "symptom", str, manifest)
    if symptom not in checks:
        raise OomLabError(
            f"{manifest}: symptom {symptom!r} is not one of this exercise's checks.",
            "Name the check the seeded bug fails.",
        )

    wrong_fixes = []
    for entry in data.get("wrong_fixes", []):
        where = f"{manifest}: [[wrong_fixes]]"
        expect = _require(entry, "expect", str, where)
        if expect not in checks:
            raise OomLabError(f"{where} expects check {expect!r}, which this exercise does not have.", "")
        edits = tuple(
            Edit(_require(e, "find", str, where), _require(e, "replace", str, where))
            for e in _require(entry, "edits", list, where)
        )
        if not edits:
            raise OomLabError(f"{where} has no edits.", "A wrong fix changes the buggy script somehow.")
        wrong_fixes.append(
            WrongFix(_require(entry, "name", str, where), expect, _require(entry, "why", str, where), edits, manifest)
        )

    return Exercise(
        id=ex_id,
        title=_require(data, "title", str, manifest),
        order=_require(data, "order", int, manifest),
        step=step,
        file=_require(data, "file", str, manifest),
        budget_bytes=budget,
        alloc_conf=_require(data, "alloc_conf", str, manifest) if "alloc_conf" in data else "",
        time_limit_s=_require(data, "time_limit_s", float, manifest),
        symptom=symptom,
        summary=" ".join(_require(data, "summary", str, manifest).split()),  # one paragraph, wrapped by whoever shows it
        hints=tuple(h.strip() for h in hints),
        checks=checks,
        wrong_fixes=tuple(wrong_fixes),
        root=root,
        manifest_path=manifest,
        solution_path=(solutions or root / "solutions") / ex_id / _require(data, "file", str, manifest),
    )
