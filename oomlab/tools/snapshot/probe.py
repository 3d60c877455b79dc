"""The snapshot tool inside the measured process: record the allocator's history, then snapshot it.

:meth:`Probe.on_start` turns on ``torch.cuda.memory._record_memory_history``
with Python stacks before the script runs. :meth:`Probe.analyse` runs when the
script is over, inside the ``except`` block if it raised, so the failed state
is still alive: it takes ``torch.cuda.memory._snapshot()``, dumps a shareable
``snapshot.pickle`` for PyTorch's viewer (:func:`write_snapshot_pickle`) and
explains the snapshot with :func:`~oomlab.tools.snapshot.analysis.analyze`.

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

from oomlab.measure.stats import FIGURES
from oomlab.oom import is_oom, parse_message
from oomlab.tools import base
from oomlab.tools.snapshot.analysis import TOOL, analyze, oom_events, shareable

__all__ = ["DEFAULT_MAX_ENTRIES", "PICKLE_PROTOCOL", "Probe", "write_snapshot_pickle"]

PICKLE_PROTOCOL = 4  # PyTorch's web viewer cannot read protocol 5 pickles
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

    def on_start(self) -> None:
        torch = self.torch
        if not torch.cuda.is_available():
            self.error = "torch sees no CUDA device, so there is no caching allocator to snapshot"
            return
        record = getattr(getattr(torch.cuda, "memory", None), "_record_memory_history", None)
        if record is None:
            self.error = f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history"
            return
        kwargs = {"max_entries": int(self.options.get("max_entries", DEFAULT_MAX_ENTRIES))}
        if _accepts(record, "stacks"):
            kwargs["stacks"] = "python"  # C++ frames make recording and the pickle many times slower
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

    def close(self) -> None:
        if self.recording:
            self.torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


def write_snapshot_pickle(snapshot: dict, path: Path, root: str | None = None, labels: dict[str, str] | None = None) -> Path:
    """Pickle a shareable copy of ``snapshot`` with protocol 4, which PyTorch's memory viewer can read.

    Its frames name files as :func:`~oomlab.tools.snapshot.analysis.shareable`
    does with ``root`` and ``labels``, so the file holds no path of this
    machine. It is written under a temporary name and renamed, so a run that
    dies half-way leaves no truncated pickle behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(shareable(snapshot, root, labels), f, protocol=PICKLE_PROTOCOL)
    os.replace(tmp, path)
    return path


def _accepts(fn, name: str) -> bool:
    """Whether ``fn`` takes a parameter ``name``: ``_record_memory_history``'s grew its parameters over versions."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
