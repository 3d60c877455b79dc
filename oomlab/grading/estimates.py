"""Grade an estimate exercise (``kind = "estimate"``): the learner's ``estimate(config)`` on hidden configs measured on
the GPU, each part within its tolerance (:mod:`oomlab.sizing.grade`), as a verdict like a script's.

The estimator answers first, in its sandbox, on any machine: an estimator that fails to load or answer is said at
once, GPU or not. Only then are the configs measured, which needs an NVIDIA GPU; without one the grade stops with
the same message ``oomlab check`` gives for a script (:func:`oomlab.measure.machine.no_driver`).
"""

from __future__ import annotations

from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.errors import OomLabError
from oomlab.measure.machine import has_nvidia_driver, no_driver
from oomlab.sizing import SIZING_CODE
from oomlab.sizing.grade import MEASURE_TIME_LIMIT_S, SIZED, SizingReport, estimate_hidden, measured_report
from oomlab.sizing.sandboxed import TIME_LIMIT_S as ANSWER_TIME_LIMIT_S

__all__ = ["ESTIMATE_CODE", "TIME_LIMIT_S", "failed_parts", "grade_estimate", "parts_of", "validate"]

# What an estimate exercise's grade depends on besides its folder: the sizing (the model, its measuring, the hidden
# configs, the tolerances, the sandbox) and this module. A verify row of one records their digest, as a script
# exercise's report records the measuring code's (oomlab.grading.truth.fingerprint).
ESTIMATE_CODE = (*SIZING_CODE, Path(__file__).resolve())

# The longest one grade may take: the estimator's answers in its sandbox, then every hidden config measured.
TIME_LIMIT_S = ANSWER_TIME_LIMIT_S + MEASURE_TIME_LIMIT_S


def validate(ex: Exercise) -> None:
    """Raise :class:`OomLabError` unless the manifest's ``sizes`` names a thing sized, each example is a config of it,
    and each wrong fix expects one of its parts: said before anything runs (as :func:`oomlab.grading.checks.validate`
    says a script's checks)."""
    manifest = ex.manifest_path
    if ex.sizes not in SIZED:
        raise OomLabError(
            f"{manifest}: sizes {ex.sizes!r} is not one of {', '.join(SIZED)}.",
            "Name what the learner's estimate() sizes: a training step (train) or a generation (decode).",
        )
    kind = SIZED[ex.sizes]
    for i, example in enumerate(ex.examples, 1):
        try:
            kind.parse(example)
        except OomLabError as err:
            raise OomLabError(f"{manifest}: [[examples]] {i}: {err.what}", "Fix that example config.") from None
    for fix in ex.wrong_fixes:
        if fix.expect not in kind.parts:
            raise OomLabError(
                f"{manifest}: [[wrong_fixes]] {fix.name!r} expects {fix.expect!r}, which is no part of what it sizes.",
                f"Name the part it gets wrong: one of {', '.join(kind.parts)}.",
            )


def parts_of(ex: Exercise) -> tuple[str, ...]:
    """The parts an estimate exercise's estimator answers, in order."""
    return SIZED[ex.sizes].parts


def grade_estimate(ex: Exercise, script: Path, *, strict: bool = False, hide: tuple[Path, ...] = ()) -> SizingReport:
    """``script``'s estimate() graded on the hidden configs of ``ex``, measured on this GPU.

    ``strict`` (a class's grading, the truth check): the estimator must run sandboxed, or nothing is graded; a
    learner's own check runs it unconfined where this kernel cannot confine it. ``hide`` keeps more folders from it.
    """
    validate(ex)
    kind, configs, estimates = estimate_hidden(script, ex.root, ex.sizes, sandbox_required=strict, hide=hide)
    if not has_nvidia_driver():
        raise no_driver(f"measuring the {len(configs)} configs your estimate is graded on")
    return measured_report(kind, configs, estimates)


def failed_parts(report: SizingReport) -> list[str]:
    """The parts outside their tolerance for at least one config, in the parts' order."""
    failed = {s.part for row in report.scores for s in row if not s.within}
    return [p for p in report.sized.parts if p in failed]
