"""One verdict: measure a script, fetch the reference, run the exercise's checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.grading.checks import CheckResult, run_checks
from oomlab.grading.reference import reference_for
from oomlab.measure.harness import MACHINE_PROBLEMS, SCRIPT_FAILURES, Measurement, measure_exercise_file
from oomlab.measure.machine import machine_error


@dataclass
class Report:
    exercise: Exercise
    measurement: Measurement
    reference: Measurement | None
    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        return self.measurement.status not in SCRIPT_FAILURES and all(c.passed for c in self.checks)

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else "fail"

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]


def grade(
    exercise: Exercise, script: Path, reference: Measurement | None = None, measurement: Measurement | None = None
) -> Report:
    """Measure ``script`` under the exercise's budget and check it against the reference.

    ``measurement`` is a run of ``script`` measured already (a class's submissions are
    measured in parallel first, :mod:`oomlab.classroom.classgrade`): it is checked instead.
    """
    m = measurement or measure_exercise_file(exercise, script)
    if m.status in MACHINE_PROBLEMS:
        raise machine_error(m, exercise)
    if m.status in SCRIPT_FAILURES:
        return Report(exercise, m, reference, [])
    ref = reference or reference_for(exercise, m.gpu, m.torch)
    if ref.status in MACHINE_PROBLEMS:
        raise machine_error(ref, exercise)
    settings = {"alloc_conf": exercise.alloc_conf, "learner_settings": exercise.learner_settings}
    return Report(exercise, m, ref, run_checks(exercise.checks, m, ref, settings))
