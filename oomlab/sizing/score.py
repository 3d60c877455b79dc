"""How close an estimate came to a measured step: each part within its stated tolerance, or not.

The tolerances say what an estimate is expected to know. The parameters, their
gradients and the optimizer state follow from the config exactly (a dtype's size
times a count), so they are held to 2%. The activations depend on what each
operator saves for backward, which an estimate reads from the model's code: 10%.
The peak depends on when, inside backward and the optimizer's step, the most is
alive at once: 15%. An error is relative to the measured figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomlab.errors import OomLabError
from oomlab.sizing import PARTS

__all__ = ["TOLERANCE", "PartScore", "checked_estimate", "score"]

TOLERANCE = {"parameters": 0.02, "gradients": 0.02, "optimizer_state": 0.02, "activations": 0.10, "peak": 0.15}


@dataclass(frozen=True)
class PartScore:
    part: str
    estimated: float
    measured: int
    tolerance: float

    @property
    def error(self) -> float:
        """The estimate's error relative to the measured bytes (0 for two zeros; infinite for a guess at nothing)."""
        if self.measured == 0:
            return 0.0 if self.estimated == 0 else math.inf
        return (self.estimated - self.measured) / self.measured

    @property
    def within(self) -> bool:
        return abs(self.error) <= self.tolerance


def checked_estimate(value, where: str, parts=PARTS) -> dict[str, float]:
    """An estimator's answer for one config: a dict with a finite, non-negative number of bytes for every part."""
    if not isinstance(value, dict):
        raise OomLabError(
            f"{where} returned {type(value).__name__}, not a dict.",
            f"Return a dict of bytes with the keys {', '.join(parts)}.",
        )
    missing = [p for p in parts if p not in value]
    if missing:
        raise OomLabError(f"{where} has no {', '.join(missing)}.", f"Return every one of {', '.join(parts)}, in bytes.")
    checked = {}
    for part in parts:
        number = value[part]
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0:
            raise OomLabError(f"{where}'s {part} is {number!r}.", "Each part is a finite, non-negative number of bytes.")
        checked[part] = float(number)
    return checked


def score(estimate: dict[str, float], measured: dict[str, int], tolerance: dict[str, float] = TOLERANCE) -> list[PartScore]:
    """Each part of one config's estimate against its measurement, in ``tolerance``'s order (a training step's parts,
    :data:`oomlab.sizing.PARTS`, by default)."""
    return [PartScore(part, estimate[part], measured[part], limit) for part, limit in tolerance.items()]
