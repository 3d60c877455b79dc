"""Submissions measured before nbgrader runs them: one file per script, keyed by what was measured.

nbgrader autogrades one notebook at a time (its FAQ), but one GPU can measure a
class's scripts many at once. ``oomlab nbgrader autograde`` measures them all in
parallel first and keeps each measurement here; the notebook's measuring cell,
run by ``nbgrader autograde`` afterwards, finds the measurement of its exact
script and checks it instead of waiting for a run of its own.

An estimate exercise's estimators are graded there too, one after another (each
grading runs its configs on the whole GPU), and each grade is kept here the same
way (:func:`store_estimate`): so the notebooks, graded several at once, never
measure configs side by side.

The key is the script's text, the exercise as pinned (manifest, buggy script,
reference fix) and the measuring code (for an estimator, the sizing's): a script
edited by one character, or an exercise rebuilt, is never answered with another
run's figures. It lives in the pinned course's ``.oomlab/class/``, beside the
cached reference measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.course.state import StateDir, write_atomic
from oomlab.errors import OomLabError
from oomlab.grading.estimates import ESTIMATE_CODE
from oomlab.grading.truth import source_digest
from oomlab.measure import MEASURING_CODE, digest
from oomlab.measure.harness import Measurement
from oomlab.sizing.grade import SizingReport

__all__ = ["cache_path", "load", "load_estimate", "store", "store_estimate"]


def cache_path(ex: Exercise, script_text: str) -> Path:
    code = ESTIMATE_CODE if ex.is_estimate else MEASURING_CODE
    key = digest(code, f"{ex.id}\0{source_digest(ex)}\0{script_text}")
    return StateDir(ex.root).path / "class" / f"{ex.id}-{key}.json"


def store(ex: Exercise, script_text: str, m: Measurement) -> None:
    write_atomic(cache_path(ex, script_text), json.dumps(m.to_json()))


def load(ex: Exercise, script: Path) -> Measurement | None:
    """The measurement made of ``script``'s exact text, as if measured at ``script``; None when there is none."""
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
        path = cache_path(ex, text)
        m = Measurement.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    m.script = str(script.resolve())  # messages name the file the learner wrote, not where it was measured
    return m


def store_estimate(ex: Exercise, script_text: str, report: SizingReport) -> None:
    write_atomic(cache_path(ex, script_text), json.dumps(report.to_json()))


def load_estimate(ex: Exercise, script: Path) -> SizingReport | None:
    """The grade of the estimator with ``script``'s exact text; None when there is none."""
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
        return SizingReport.from_json(json.loads(cache_path(ex, text).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError, OomLabError):  # none, or not one this code wrote: grade again
        return None
