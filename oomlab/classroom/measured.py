"""Submissions measured before nbgrader runs them: one file per script, keyed by what was measured.

nbgrader autogrades one notebook at a time (its FAQ), but one GPU can measure a
class's scripts many at once. ``oomlab nbgrader autograde`` measures them all in
parallel first and keeps each measurement here; the notebook's measuring cell,
run by ``nbgrader autograde`` afterwards, finds the measurement of its exact
script and checks it instead of waiting for a run of its own.

The key is the script's text, the exercise as pinned (manifest, buggy script,
reference fix) and the measuring code: a script edited by one character, or an
exercise rebuilt, is never answered with another run's figures. It lives in the
pinned course's ``.oomlab/class/``, beside the cached reference measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.course.state import StateDir, write_atomic
from oomlab.grading.truth import source_digest
from oomlab.measure import MEASURING_CODE, digest
from oomlab.measure.harness import Measurement

__all__ = ["cache_path", "load", "store"]


def cache_path(ex: Exercise, script_text: str) -> Path:
    key = digest(MEASURING_CODE, f"{ex.id}\0{source_digest(ex)}\0{script_text}")
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
