"""One verdict: measure a script, fetch the reference, run the exercise's checks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.errors import OomLabError
from oomlab.grading.checks import CheckResult, run_checks, validate
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
    exercise: Exercise,
    script: Path,
    reference: Measurement | None = None,
    measurement: Measurement | None = None,
    *,
    strict: bool = False,
    hide: tuple[Path, ...] = (),
) -> Report:
    """Measure ``script`` under the exercise's budget, sandboxed, and check it against the reference.

    ``measurement`` is a run of ``script`` measured already (a class's submissions are
    measured in parallel first, :mod:`oomlab.classroom.classgrade`): it is checked instead.
    ``strict`` (a class's grading, the truth check): a machine that cannot sandbox the
    run or let the driver witness it measures nothing, which raises as a machine problem;
    a learner's own check runs there anyway and its report says what was not enforced.
    ``hide`` keeps more folders from the run (a class's folder).
    """
    validate(exercise)  # a manifest naming a check that does not exist is said before minutes of measuring
    m = measurement or measure_exercise_file(exercise, script, sandbox_required=strict, hide=hide)
    if m.status in MACHINE_PROBLEMS:
        raise machine_error(m, exercise)
    if strict:
        require_witness(m, exercise)
    if m.status in SCRIPT_FAILURES:
        return Report(exercise, m, reference, [reached] if (reached := reached_for_hidden(m)) else [])
    ref = reference or reference_for(exercise, m.gpu, m.torch)
    if ref.status in MACHINE_PROBLEMS:
        raise machine_error(ref, exercise)
    settings = {"alloc_conf": exercise.alloc_conf, "learner_settings": exercise.learner_settings}
    return Report(exercise, m, ref, run_checks(exercise.checks, m, ref, settings))


SANDBOX_WHY = "Grading keeps the course's answers and its own files out of the measured script's reach."


def reached_for_hidden(m: Measurement) -> CheckResult | None:
    """The failed check of a run that ended reaching for something the sandbox hides, or None."""
    hidden = (m.sandbox or {}).get("hidden") or []
    if m.status != "error" or not hidden or "Permission denied" not in m.message:
        return None
    for path in re.findall(r"'([^']+)'", m.message):
        if any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
            return CheckResult(
                "sandbox",
                False,
                f"reached for {path}",
                "nothing grading keeps hidden",
                SANDBOX_WHY,
                f"The script tried to open {path}{f' at {m.where}' if m.where else ''}: while it is graded, the reference "
                "fixes, the reference measurements, the course's history and the harness's files are out of its reach.",
            )
    return None


def unwitnessed(m: Measurement) -> str:
    """Why the driver did not witness ``m``, or "" when it did (a run without CUDA has nothing to witness)."""
    if m.stats is None:
        return ""
    driver = (m.witness or {}).get("driver") or {}
    return "" if driver.get("available") else driver.get("reason") or "the supervisor made no report"


def require_witness(m: Measurement, exercise: Exercise) -> None:
    """For a grade that others rely on: the run must have been sandboxed and witnessed by the driver."""
    if m.status in ("missing", "syntax"):
        return  # nothing ran
    sandbox = m.sandbox or {}
    if sandbox.get("applied") is False and sandbox.get("reason") and m.status not in ("timeout", "crashed"):
        # Said by the child before the script ran. A result with no sandbox report at all is not the harness's
        # (a script wrote it): the untampered check fails that run; the machine is not to blame.
        raise OomLabError(
            f"The run of {exercise.id} was not sandboxed: {sandbox['reason']}.",
            "A grade others rely on needs Linux 5.13 or newer with Landlock enabled, so that a script cannot read the "
            "reference fixes; grade on such a machine.",
        )
    if why := unwitnessed(m):
        raise OomLabError(
            f"The driver could not witness the run of {exercise.id}: {why}.",
            "A grade others rely on needs the driver's per-process figures (nvidia-ml-py, and in a container the host's "
            "process ids: docker run --pid=host); grade on such a machine.",
        )
