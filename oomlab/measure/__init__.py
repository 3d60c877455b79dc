"""Measuring a training script: one new process per run, under a memory budget.

- :mod:`~oomlab.measure.harness` starts the process and turns every way a run can
  end into a :class:`~oomlab.measure.harness.Measurement`;
- :mod:`~oomlab.measure.child` runs inside that process: sandbox, budget, guards,
  workload observer, the learner's script, one JSON result and the final weights;
- :mod:`~oomlab.measure.supervisor` starts it and enforces the time limit, and
  :mod:`~oomlab.measure.witness` watches it from outside: the driver's figure for
  its GPU memory, other processes of the run on the GPU, its CPU time and host memory;
- :mod:`~oomlab.measure.sandbox` (Landlock) and :mod:`~oomlab.measure.confine` (the
  policy) keep a graded script from the answers; :mod:`~oomlab.measure.weights`
  digests the final weights for a comparison tensor by tensor;
- :mod:`~oomlab.measure.server` keeps torch imported and forks that process, so a
  run costs its workload and not the imports; :mod:`~oomlab.measure.warm` starts,
  finds and asks such servers;
- :mod:`~oomlab.measure.stats` names the allocator figures read;
- :mod:`~oomlab.measure.declared` reads the allocator settings a script sets for itself;
- :mod:`~oomlab.measure.machine` says what this machine can measure (``oomlab doctor``)
  and explains a measurement the machine, not the script, stopped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The code a measurement depends on: change any of it and earlier figures no longer stand.
MEASURING_CODE = (
    _HERE / "child.py",
    _HERE / "harness.py",
    _HERE / "server.py",
    _HERE / "warm.py",
    _HERE / "stats.py",
    _HERE / "declared.py",
    _HERE / "supervisor.py",
    _HERE / "witness.py",
    _HERE / "sandbox.py",
    _HERE / "confine.py",
    _HERE / "weights.py",
    _HERE / "nvml.py",
    _HERE.parent / "oom.py",
    _HERE.parent / "frames.py",
)


def digest(paths, extra: str = "") -> str:
    """A short hash of the files' bytes (in the order given) and ``extra``."""
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
        h.update(b"\0")
    h.update(extra.encode())
    return h.hexdigest()[:16]
