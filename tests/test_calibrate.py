"""Sizing a budget from the fixes' peaks: a margin above the largest, in whole 64 MiB steps."""

from __future__ import annotations

from oomlab.grading.calibrate import MARGIN, STEP_BYTES, proposed_budget
from oomlab.units import MIB


def test_the_budget_leaves_the_largest_fix_its_margin_in_whole_steps():
    budget = proposed_budget([900 * MIB, 1000 * MIB])
    assert budget % STEP_BYTES == 0
    assert budget >= 1000 * MIB * (1 + MARGIN)
    assert budget - STEP_BYTES < 1000 * MIB * (1 + MARGIN)  # the smallest such step
    assert proposed_budget([1000 * MIB]) == budget  # only the largest fix counts
