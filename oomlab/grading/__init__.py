"""Grading: a measurement against the reference fix, and the course's own truth check.

- :mod:`~oomlab.grading.checks`: the named checks (no OOM, untampered, peaks,
  retries, same workload, same results); a manifest picks them and their thresholds;
- :mod:`~oomlab.grading.reference`: the reference fix measured once per GPU, torch and source;
- :mod:`~oomlab.grading.verdict`: measure, fetch the reference, run the checks: one ``Report``;
- :mod:`~oomlab.grading.cheats`: generic cheats every exercise must catch;
- :mod:`~oomlab.grading.truth`: the one truth check, for ``oomlab dev verify`` and ``pytest graders --solutions``;
- :mod:`~oomlab.grading.pytest_plugin`: the graders' pytest options and GPU skipping.
"""
