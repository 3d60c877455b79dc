"""The reference solution's measurement, cached per GPU, torch version and source.

Relative thresholds ("no more than the reference + 10%") only mean something
against the reference measured on the same GPU and torch build, so the cache
key holds both, plus the bytes of the solution, the manifest and the measuring
code: change any of them and the reference is measured again.
"""

from __future__ import annotations

import json
from pathlib import Path

from oomlab.course.state import StateDir, write_atomic
from oomlab.errors import OomLabError
from oomlab.measure import MEASURING_CODE, digest
from oomlab.measure.harness import MACHINE_PROBLEMS, Measurement, measure_exercise_file


def cache_path(exercise, gpu: str, torch_version: str) -> Path:
    key = digest([exercise.solution_path, exercise.manifest_path, *MEASURING_CODE], f"{gpu}|{torch_version}")
    return StateDir(exercise.root).references / f"{exercise.id}-{key}.json"


def measure_reference(exercise) -> Measurement:
    """Measure the reference solution now and cache it; it must run cleanly, or the course itself is broken."""
    if not exercise.solution_path.is_file():
        raise OomLabError(
            f"The reference solution {exercise.solution_path} is missing.",
            "Reinstall oomlab, or restore it from the course repository (git checkout -- solutions/).",
        )
    ref = measure_exercise_file(exercise, exercise.solution_path)
    if ref.status in MACHINE_PROBLEMS:
        return ref  # the caller explains the machine problem
    caught_max = exercise.checks.get("no_oom", {}).get("caught_max", 0)  # OOMs it recovers from by design
    if ref.status != "ok" or (ref.stats or {}).get("ooms", 0) > caught_max:
        raise OomLabError(
            f"The reference solution of {exercise.id} did not run cleanly here ({ref.status}: {ref.message[:300]}).",
            "The course was verified on an NVIDIA H200; run `oomlab doctor` and report this with its output.",
        )
    write_atomic(cache_path(exercise, ref.gpu, ref.torch), json.dumps(ref.to_json()))
    return ref


def reference_for(exercise, gpu: str, torch_version: str) -> Measurement:
    """The cached reference for this GPU and torch, measured once when missing."""
    path = cache_path(exercise, gpu, torch_version)
    if path.is_file():
        try:
            return Measurement.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError):
            path.unlink()  # a damaged cache entry is only a cache entry: measure again
    return measure_reference(exercise)
