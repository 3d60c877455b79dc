"""One verdict: measure a script, fetch the reference, run the exercise's checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oomlab.grading.checks import CheckResult, run_checks
from oomlab.errors import OomLabError
from oomlab.measure.harness import MACHINE_PROBLEMS, SCRIPT_FAILURES, Measurement, measure_exercise_file
from oomlab.course.manifest import Exercise
from oomlab.grading.reference import reference_for
from oomlab.units import GIB



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


def machine_error(m: Measurement, exercise: Exercise) -> OomLabError:
    """The machine, not the script, stops the measurement: say what and what to do."""
    budget = f"{exercise.budget_bytes / GIB:.2f} GiB"
    if m.status == "no_torch":
        return OomLabError("PyTorch is not installed in this Python environment.", "Run `make start`, which installs it.")
    if m.status == "torch_too_old":
        return OomLabError(f"{m.message}; the course needs torch 2.4 or newer.", "Upgrade it: pip install -U torch")
    if m.status == "no_cuda":
        return OomLabError(
            f"No CUDA GPU is visible: {m.message}.",
            "Measuring needs an NVIDIA GPU. Without one, `oomlab list`, `hint`, `reset` and `doctor` still work, "
            "and the course pages read fine.",
        )
    if m.status == "gpu_too_small":
        return OomLabError(
            f"This GPU ({m.gpu}, {m.gpu_total_bytes / GIB:.2f} GiB) is smaller than {exercise.id}'s budget of {budget}.",
            f"Use a GPU with at least {budget} of memory.",
        )
    if m.status == "gpu_busy":
        return OomLabError(
            f"Other processes hold memory on {m.gpu}: {m.gpu_free_bytes / GIB:.2f} GiB is free.",
            f"{exercise.id} needs {budget} free. `nvidia-smi` lists who holds it; stop them and try again.",
        )
    return OomLabError(f"The measurement could not start: {m.status}: {m.message}", "Run `oomlab doctor`.")


def grade(exercise: Exercise, script: Path, reference: Measurement | None = None) -> Report:
    """Measure ``script`` under the exercise's budget and check it against the reference."""
    m = measure_exercise_file(exercise, script)
    if m.status in MACHINE_PROBLEMS:
        raise machine_error(m, exercise)
    if m.status in SCRIPT_FAILURES:
        return Report(exercise, m, reference, [])
    ref = reference or reference_for(exercise, m.gpu, m.torch)
    if ref.status in MACHINE_PROBLEMS:
        raise machine_error(ref, exercise)
    return Report(exercise, m, ref, run_checks(exercise.checks, m, ref))
