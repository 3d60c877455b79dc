"""The snapshot tool inside the measured process: record the allocator's history, then snapshot it.

:meth:`Probe.on_start` turns on ``torch.cuda.memory._record_memory_history``
before the script runs, bounded for long runs:

- ``stacks="python"``: each event keeps its Python stack only. The default,
  ``"all"``, adds the C++ frames, some tens per event, which makes recording
  slower, and the dump many times larger and slower to write, since every C++
  frame is symbolized; the learner's lines are in the Python frames anyway.
  (The argument exists since torch 2.1; a torch without it keeps its default.)
- ``max_entries`` (:data:`DEFAULT_MAX_ENTRIES`): the history is a ring buffer of
  the last events, so its memory, and the snapshot's size, are bounded however
  long the run; the analysis reconstructs a history that starts mid-run from
  the snapshot's end state (:func:`~oomlab.tools.snapshot.analysis.timeline`).

:meth:`Probe.analyse` runs when the script is over, inside the ``except`` block
if it raised, so the failed state is still alive: it takes
``torch.cuda.memory._snapshot()``, asks the driver at once what the process
uses (:mod:`oomlab.measure.nvml`; read when the script began too, which
measures this process's CUDA context), dumps a shareable ``snapshot.pickle``
for PyTorch's viewer (:func:`write_snapshot_pickle`) and explains the snapshot
with :func:`~oomlab.tools.snapshot.analysis.analyze`.

Options (all optional): ``script``, ``budget_bytes``, ``max_entries`` (the
history's ring buffer), ``context`` (what ``_record_memory_history`` records
with each event), and ``root`` and ``labels``, which name the files in the
shared pickle (see :func:`oomlab.frames.portable`).
"""

from __future__ import annotations

import inspect
import os
import pickle
import sys
from pathlib import Path

from oomlab.measure import nvml
from oomlab.measure.stats import FIGURES
from oomlab.oom import is_oom, parse_message
from oomlab.tools import base
from oomlab.tools.snapshot.analysis import TOOL, analyze, oom_events, shareable

__all__ = ["DEFAULT_MAX_ENTRIES", "PICKLE_PROTOCOL", "Probe", "write_snapshot_pickle"]

PICKLE_PROTOCOL = 4  # PyTorch's web viewer cannot read protocol 5 pickles
# The last 200,000 events: a dump of about 25 MB with Python stacks 32 frames deep, read and analyzed in
# about a second (`python -m oomlab.bench.big_snapshot --events 200000 --source synthetic`).
DEFAULT_MAX_ENTRIES = 200_000

# The allocator's own counters, to cross-check the snapshot's totals: the result's name -> FIGURES' name.
ALLOCATOR_STATS = {
    "reserved": "reserved_final",
    "allocated": "allocated_final",
    "inactive_split": "inactive_split_final",
    "peak_reserved": "peak_reserved",
    "peak_allocated": "peak_allocated",
    "retries": "retries",
    "ooms": "ooms",
}


class Probe(base.Probe):
    """Record allocator history around the script; snapshot, dump and explain it at the end."""

    tool = TOOL
    recording = False  # True from a successful start until close(): only then is there history to stop
    driver_at_start: dict | None = None  # the driver's figure and reserved bytes when the script began

    def on_start(self) -> None:
        torch = self.torch
        if not torch.cuda.is_available():
            self.error = "torch sees no CUDA device, so there is no caching allocator to snapshot"
            return
        record = getattr(getattr(torch.cuda, "memory", None), "_record_memory_history", None)
        if record is None:
            self.error = f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history"
            return
        # Before the script, with the CUDA context made by the harness and nothing of the script's on the GPU:
        # what the driver counts now, less reserved, is this process's context.
        self.driver_at_start = {"reading": nvml.read_process_memory(), "reserved": self.reserved_everywhere()}
        kwargs = {"max_entries": int(self.options.get("max_entries", DEFAULT_MAX_ENTRIES))}
        if _accepts(record, "stacks"):
            kwargs["stacks"] = "python"  # C++ frames make recording and the dump many times slower and larger
        if "context" in self.options and _accepts(record, "context"):
            kwargs["context"] = self.options["context"]
        try:
            record(**kwargs)
        except TypeError:
            record()  # an older signature: keep the defaults rather than record nothing
        self.recording = True

    def analyse(self, exc: BaseException | None, script_globals: dict | None) -> dict:
        """Snapshot the allocator, dump the shareable pickle, and explain the snapshot.

        The history's own "oom" entry gives the failed request's exact size; only
        without one is the request read from the OOM message, rounded as it is.
        """
        if not self.recording:
            raise RuntimeError("recording was never started (start() did not run)")
        snapshot = self.torch.cuda.memory._snapshot()
        driver = {"reading": nvml.read_process_memory(), "start": self.driver_at_start}  # at once, as the snapshot stands
        try:
            write_snapshot_pickle(
                snapshot, self.out_dir / "snapshot.pickle", self.options.get("root"), self.options.get("labels")
            )
            pickle_error = None
        except Exception as err:  # noqa: BLE001 - the analysis is still worth writing
            pickle_error = f"could not write snapshot.pickle: {err}"

        parsed = parse_message(str(exc)) if is_oom(exc) else {"request": None, "allowed": None}
        request = None if oom_events(snapshot) else parsed["request"]  # the history's exact size wins
        budget = self.options.get("budget_bytes") or parsed["allowed"]
        script = self.script or (script_globals or {}).get("__file__") or (sys.argv[0] if sys.argv else None)

        result = analyze(
            snapshot,
            failed_request=request,
            script=script,
            budget_bytes=budget,
            max_entries=int(self.options.get("max_entries", DEFAULT_MAX_ENTRIES)),
            driver=driver,
        )
        if request is not None:
            result["oom"]["source"] = "message"
        result["run_failed"] = exc is not None
        result["error_type"] = type(exc).__name__ if exc is not None else None
        result["budget_source"] = "options" if self.options.get("budget_bytes") else ("message" if budget else None)
        result["allocator_stats"] = self.allocator_stats()
        result["snapshot_file"] = None if pickle_error else "snapshot.pickle"
        if pickle_error:
            result["notes"].append(pickle_error)
        return result

    def allocator_stats(self) -> dict:
        """:data:`ALLOCATOR_STATS` from ``memory_stats()``, leaving out what this torch does not report."""
        try:
            raw = self.torch.cuda.memory_stats()
        except Exception:  # noqa: BLE001 - a cross-check, not worth losing the analysis for
            return {}
        return {name: int(raw[FIGURES[fig]]) for name, fig in ALLOCATOR_STATS.items() if FIGURES[fig] in raw}

    def reserved_everywhere(self) -> int | None:
        """What the allocator reserved on every device, as the driver's figure covers them all; None if unknown."""
        cuda = self.torch.cuda
        try:
            return sum(int(cuda.memory_stats(d).get(FIGURES["reserved_final"], 0)) for d in range(cuda.device_count()))
        except Exception:  # noqa: BLE001 - the context is then not measured, and the report says whose figure it uses
            return None

    def close(self) -> None:
        if self.recording:
            self.torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


def write_snapshot_pickle(snapshot: dict, path: Path, root: str | None = None, labels: dict[str, str] | None = None) -> Path:
    """Pickle ``snapshot`` with protocol 4, which PyTorch's memory viewer can read, its files named for sharing.

    Its frames name files as :func:`~oomlab.tools.snapshot.analysis.shareable`
    does with ``root`` and ``labels``, so the file holds no path of this
    machine; ``snapshot`` keeps its own names. Frames and stacks that torch
    shares between events stay shared, and pickle writes each once. The file
    is written under a temporary name and renamed, so a run that dies half-way
    leaves no truncated pickle behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f, shareable(snapshot, root, labels) as named:
        pickle.dump(named, f, protocol=PICKLE_PROTOCOL)
    os.replace(tmp, path)
    return path


def _accepts(fn, name: str) -> bool:
    """Whether ``fn`` takes a parameter ``name``: ``_record_memory_history``'s grew its parameters over versions."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
