"""What the witness costs: the same runs with the driver read every few milliseconds, and not read at all.

The supervisor of every measured run reads the driver (NVML) every
:data:`~oomlab.measure.witness.INTERVAL_S` seconds for the whole run
(:mod:`oomlab.measure.witness`). This times, for each exercise asked for, its
reference fix ``repeat`` times each way, alternating, forked from a warm
server as ``oomlab watch`` measures, and reports the medians:

- ``script_wall_s``: the learner's script from its first line to the figures,
  with and without the driver read (what sampling costs the measured run);
- ``run_s``: the whole run, from the request to the supervisor's report;
- ``supervisor_cpu_s``: the CPU the supervisor itself spent, most of it sampling;
- ``samples``, ``sample_ms_mean`` and ``sample_ms_max``: how often the driver
  was read and how long one reading took.

A benchmark, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from oomlab.course import Course
from oomlab.course.shipped import init_course
from oomlab.measure import warm
from oomlab.measure.harness import child_env, measure_exercise_file
from oomlab.measure.witness import INTERVAL_S

__all__ = ["measure"]


def _median(values: list[float], digits: int = 3) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), digits) if values else None


def measure(exercises: list[str], repeat: int) -> dict:
    """Each exercise's reference fix, ``repeat`` runs with the driver read and as many without."""
    with tempfile.TemporaryDirectory(prefix="oomlab-bench-witness-") as tmp:
        root = Path(tmp) / "course"
        init_course(root)
        course = Course(root)
        chosen = [course.get(e) for e in exercises] if exercises else course.scripts[:3]
        rows = {}
        with warm.serving(root, {ex.alloc_conf for ex in chosen}, child_env) as servers:
            for server in servers:
                server.wait_ready()
            for ex in chosen:
                runs = {"with": [], "without": []}
                for _ in range(repeat):
                    for way in runs:
                        m = measure_exercise_file(ex, ex.solution_path, witness_driver=way == "with")
                        runs[way].append(m)
                rows[ex.id] = {way: _summary(ms) for way, ms in runs.items()}
    for row in rows.values():
        base = row["without"]["script_wall_s"]
        row["script_wall_overhead"] = round(row["with"]["script_wall_s"] / base - 1, 4) if base else None
    return {"interval_s": INTERVAL_S, "repeat": repeat, "exercises": rows}


def _summary(ms) -> dict:
    witnesses = [m.witness or {} for m in ms]
    drivers = [w.get("driver") or {} for w in witnesses]
    return {
        "script_wall_s": _median([m.wall_s for m in ms]),
        "run_s": _median([w.get("process_s") for w in witnesses]),
        "supervisor_cpu_s": _median([w.get("supervisor_cpu_s") for w in witnesses]),
        "samples": _median([d.get("samples") for d in drivers], 0),
        "sample_ms_mean": _median([1000 * d["sample_s_mean"] for d in drivers if d.get("sample_s_mean") is not None]),
        "sample_ms_max": _median([1000 * d["sample_s_max"] for d in drivers if d.get("sample_s_max") is not None]),
        "runner": sorted({m.runner for m in ms}),
        "statuses": sorted({m.status for m in ms}),
    }
