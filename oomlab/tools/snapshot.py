"""Step 1 of the workflow: the caching allocator's snapshot, read for fragmentation.

The probe records the allocator's history while the script runs, and at the
end (inside the ``except`` block when the script raised, so the failed state is
still alive) takes :func:`torch.cuda.memory._snapshot`, dumps it next to its
JSON for PyTorch's own viewer, and explains it:

- how much of the reserved memory is live, free, and free but *stranded*
  (inside a segment that a live block keeps from being released);
- which live blocks pin which segments, and where in the learner's script they
  were allocated;
- whether the failed request could have fitted in any free block;
- allocated and reserved bytes over the recorded history.

Snapshot format (see ``torch.cuda.memory._snapshot``)::

    {"segments": [{"address", "total_size", "stream", "segment_type": "small" | "large",
                   "allocated_size", "active_size", "is_expandable",
                   "blocks": [{"address", "size", "requested_size",
                               "state": "active_allocated" | "active_pending_free" | "inactive",
                               "frames": [{"filename", "line", "name"}, ...]}]}],
     "device_traces": [[{"action", "addr" (or "device_free" for "oom"), "size", "stream",
                         "frames", "time_us" (newer torch)}, ...] per device]}

Frames are listed innermost first. The analysis half (:func:`load_snapshot`,
:func:`analyze`, :func:`render`, :func:`draw`) needs no torch and no GPU.
"""

from __future__ import annotations

import inspect
import io
import json
import linecache
import os
import pickle
import re
import sys
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.units import MIB, mib

TOOL = "snapshot"
SMALL_REQUEST_MAX = 1 << 20  # kSmallSize: requests up to 1 MiB come from the small pool
PICKLE_PROTOCOL = 4  # PyTorch's web viewer cannot read protocol 5 pickles
DEFAULT_MAX_ENTRIES = 200_000
MAX_TIMELINE_POINTS = 2000
MAX_DRAWN_SEGMENTS = 60
MAX_LISTED_SEGMENTS = 500  # in the JSON; the totals always cover every segment
MAX_LISTED_PINNED = 100
MAX_LISTED_OWNERS = 20
STRANDED_SHARE = 0.2  # stranded free space worth calling fragmentation, as a share of reserved
STRANDED_FLOOR = 32 * MIB  # ... and at least this much, so a few small-pool segments don't count

LIVE, PENDING, FREE = "live", "pending", "free"
RESERVED_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
# A block stops being allocated when it is freed (free_requested); free_completed only ends the
# wait on other streams, as the snapshot's active_allocated vs active_pending_free says. Both
# entries carry the block's requested size, not its rounded size.
ALLOCATED_DELTA = {"alloc": 1, "free_requested": -1}

_state: dict = {"recording": False, "error": None, "options": {}}


# --------------------------------------------------------------------------- probe (inside the run)


def start(torch, out_dir: Path, options: dict) -> None:
    """Begin recording allocator history with Python stacks, before the script runs.

    Never raises: a problem is kept and reported by :func:`finish` in the JSON.
    """
    _state.update(recording=False, error=None, options=dict(options or {}))
    try:
        if not torch.cuda.is_available():
            _state["error"] = "torch sees no CUDA device, so there is no caching allocator to snapshot"
            return
        record = getattr(getattr(torch.cuda, "memory", None), "_record_memory_history", None)
        if record is None:
            _state["error"] = f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history"
            return
        kwargs = {"max_entries": int(_state["options"].get("max_entries", DEFAULT_MAX_ENTRIES))}
        if _accepts(record, "stacks"):
            kwargs["stacks"] = "python"  # C++ frames make recording and the pickle many times slower
        if "context" in _state["options"] and _accepts(record, "context"):
            kwargs["context"] = _state["options"]["context"]
        try:
            record(**kwargs)
        except TypeError:
            record()  # an older signature: keep the defaults rather than record nothing
        _state["recording"] = True
    except Exception as err:  # noqa: BLE001 - the probe must never break the learner's run
        _state["error"] = f"could not start recording: {type(err).__name__}: {err}"


def finish(torch, out_dir: Path, exc: BaseException | None, script_globals: dict | None) -> None:
    """Snapshot the allocator, dump ``snapshot.pickle`` and write ``snapshot.json``; never raises."""
    out_dir = Path(out_dir)
    result: dict = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        result = _finish(torch, out_dir, exc, script_globals)
    except BaseException as err:  # noqa: BLE001 - whatever happens, the JSON says it
        result = error_result(f"{type(err).__name__}: {err}")
    try:
        with open(out_dir / f"{TOOL}.json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
    except Exception as err:  # noqa: BLE001
        print(f"[oomlab] the snapshot tool could not write its JSON: {err}", file=sys.stderr)


def _finish(torch, out_dir: Path, exc: BaseException | None, script_globals: dict | None) -> dict:
    options = _state["options"]
    if _state["error"] or not _state["recording"]:
        return error_result(_state["error"] or "recording was never started (start() did not run)")
    try:
        snapshot = torch.cuda.memory._snapshot()
    finally:
        _stop_recording(torch)
    pickle_error = None
    try:
        write_snapshot_pickle(snapshot, out_dir / "snapshot.pickle")
    except Exception as err:  # noqa: BLE001 - the analysis is still worth writing
        pickle_error = f"could not write snapshot.pickle: {err}"

    message = str(exc) if exc is not None else ""
    is_oom = exc is not None and (
        isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())) or "out of memory" in message
    )
    parsed = parse_oom_message(message) if is_oom else {"request": None, "allowed": None}
    request = None if oom_events(snapshot) else parsed["request"]  # the trace's exact size wins
    budget = options.get("budget_bytes") or parsed["allowed"]
    script = options.get("script") or (script_globals or {}).get("__file__") or (sys.argv[0] if sys.argv else None)

    result = analyze(
        snapshot,
        failed_request=request,
        script=script,
        budget_bytes=budget,
        max_entries=int(options.get("max_entries", DEFAULT_MAX_ENTRIES)),
    )
    if request is not None:
        result["oom"]["source"] = "message"
    result["run_failed"] = exc is not None
    result["error_type"] = type(exc).__name__ if exc is not None else None
    result["budget_source"] = "options" if options.get("budget_bytes") else ("message" if budget else None)
    result["allocator_stats"] = _allocator_stats(torch)
    result["snapshot_file"] = None if pickle_error else "snapshot.pickle"
    if pickle_error:
        result["notes"].append(pickle_error)
    return result


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _stop_recording(torch) -> None:
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:  # noqa: BLE001 - nothing else runs after us in this process
        pass
    _state["recording"] = False


def _allocator_stats(torch) -> dict:
    """The allocator's own counters, to cross-check the snapshot's totals."""
    try:
        raw = torch.cuda.memory_stats()
    except Exception:  # noqa: BLE001
        return {}
    keys = {
        "reserved": "reserved_bytes.all.current",
        "allocated": "allocated_bytes.all.current",
        "inactive_split": "inactive_split_bytes.all.current",
        "peak_reserved": "reserved_bytes.all.peak",
        "peak_allocated": "allocated_bytes.all.peak",
        "retries": "num_alloc_retries",
        "ooms": "num_ooms",
    }
    return {name: int(raw[key]) for name, key in keys.items() if key in raw}


def write_snapshot_pickle(snapshot: dict, path: Path) -> Path:
    """Pickle the snapshot with protocol 4, which PyTorch's memory viewer can read."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
    os.replace(tmp, path)
    return path


def error_result(message: str) -> dict:
    return {
        "tool": TOOL,
        "kind": "error",
        "headline": f"No allocator snapshot: {message}.",
        "culprit_bytes": 0,
        "error": message,
    }


# --------------------------------------------------------------------------- loading


class _PlainDataUnpickler(pickle.Unpickler):
    """A snapshot is plain dicts, lists, strings and numbers: refuse any class or function.

    This also keeps a pickle from elsewhere from running code when we open it.
    """

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it refers to the Python object {module}.{name}")


def load_snapshot(path) -> dict:
    """Read a pickled snapshot, checked and filled in for :func:`analyze`.

    Raises :class:`graders.errors.OomLabError` saying what is wrong and what to
    do for a missing file, a file that is not a (complete) pickle, a pickle
    that is not a snapshot, or a snapshot in a format this tool does not know.
    """
    path = Path(path)
    retake = "Run the exercise again with the snapshot tool to write a new one."
    if not path.exists():
        raise OomLabError(f"No snapshot at {path}.", retake)
    if path.is_dir():
        raise OomLabError(f"{path} is a folder, not a snapshot file.", "Give the path of the .pickle file.")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise OomLabError(f"Cannot read {path}: {err.strerror or err}.", "Check the file's permissions.") from None
    if not data:
        raise OomLabError(f"{path} is empty: the run stopped before the snapshot was written.", retake)
    try:
        snapshot = _PlainDataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as err:
        if "refers to the Python object" in str(err):
            raise OomLabError(
                f"{path} is a pickle but not an allocator snapshot: {err}.",
                "Give the file written by torch.cuda.memory._dump_snapshot() or by this tool.",
            ) from None
        raise OomLabError(f"{path} is not a readable pickle (corrupt or truncated): {err}.", retake) from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError, RecursionError) as err:
        raise OomLabError(
            f"{path} is not a readable pickle (corrupt or truncated): {type(err).__name__}: {err}.", retake
        ) from None
    if isinstance(snapshot, list):  # torch's own loader takes a bare list of segments too
        snapshot = {"segments": snapshot, "device_traces": []}
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        what = f"a dict with keys {sorted(map(str, snapshot))[:8]}" if isinstance(snapshot, dict) else type(snapshot).__name__
        raise OomLabError(
            f"{path} is a pickle but not an allocator snapshot: it holds {what}, with no 'segments'.",
            "Give the file written by torch.cuda.memory._dump_snapshot() or by this tool.",
        )
    return normalize(snapshot, where=str(path))


def normalize(snapshot: dict, where: str = "the snapshot") -> dict:
    """Check that a snapshot has what the analysis needs and fill in what older versions lack.

    Needs per segment ``address``, ``total_size`` and ``blocks``, per block
    ``size`` and ``state``. Optional keys get defaults: ``segment_type`` from the
    size, ``requested_size`` = ``size``, ``frames`` from a legacy ``history``.
    """
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        raise OomLabError(f"{where}: 'segments' is a {type(segments).__name__}, not a list.", _FOREIGN_TODO)
    missing: set[str] = set()
    states: set[str] = set()
    for seg in segments:
        if not isinstance(seg, dict):
            raise OomLabError(f"{where}: a segment is a {type(seg).__name__}, not a dict.", _FOREIGN_TODO)
        missing.update(f"segment '{k}'" for k in ("address", "total_size", "blocks") if k not in seg)
        for block in seg.get("blocks") or []:
            if not isinstance(block, dict):
                raise OomLabError(f"{where}: a block is a {type(block).__name__}, not a dict.", _FOREIGN_TODO)
            missing.update(f"block '{k}'" for k in ("size", "state") if k not in block)
            if isinstance(block.get("state"), str):
                states.add(block["state"])
    if missing:
        raise OomLabError(
            f"{where} was written in a snapshot format this tool does not know (another torch version?): "
            f"missing {', '.join(sorted(missing))}.",
            _FOREIGN_TODO,
        )
    unknown = sorted(s for s in states if _state_of(s) is None)
    if unknown:
        raise OomLabError(f"{where} has block states this tool does not know: {', '.join(unknown)}.", _FOREIGN_TODO)

    out_segments = []
    for seg in segments:
        blocks = []
        for block in seg["blocks"]:
            frames = block.get("frames")
            if frames is None and block.get("history"):  # torch < 2.1 kept frames in history
                frames = block["history"][0].get("frames", [])
            blocks.append(
                {
                    **block,
                    "requested_size": block.get("requested_size", block["size"]),
                    "frames": frames or [],
                }
            )
        total = seg["total_size"]
        out_segments.append(
            {
                **seg,
                "stream": seg.get("stream", 0),
                "segment_type": seg.get("segment_type") or ("small" if total <= 2 * MIB else "large"),
                "blocks": blocks,
            }
        )
    traces = snapshot.get("device_traces") or []
    if not isinstance(traces, list) or any(not isinstance(t, list) for t in traces):
        raise OomLabError(f"{where}: 'device_traces' is not a list of lists.", _FOREIGN_TODO)
    return {**snapshot, "segments": out_segments, "device_traces": traces}


_FOREIGN_TODO = (
    "Take the snapshot again with torch 2.4 or newer (torch.cuda.memory._snapshot()), "
    "or run the exercise with the snapshot tool."
)


def _state_of(state: str) -> str | None:
    if state == "active_allocated":
        return LIVE
    if state.startswith("active_"):  # active_pending_free; the docs spell it active_awaiting_free
        return PENDING
    if state == "inactive":
        return FREE
    return None


# --------------------------------------------------------------------------- analysis


def parse_oom_message(message: str) -> dict:
    """The request and the per-process cap out of an OOM message, in bytes (None if absent).

    ``"Tried to allocate 32.00 MiB"`` is the size the allocator tried to get
    (the segment size on a cache miss); ``"1.12 GiB allowed;"`` appears when
    ``set_per_process_memory_fraction`` capped the process. Both are rounded to
    two decimals by the allocator's formatting.
    """
    units = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    pattern = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"

    def grab(regex: str) -> int | None:
        match = re.search(regex, message or "")
        return int(round(float(match.group(1)) * units[match.group(2)])) if match else None

    return {"request": grab(r"Tried to allocate " + pattern), "allowed": grab(pattern + r" allowed")}


def device_trace(snapshot: dict) -> list:
    """The history of the device that holds the segments (else the longest history)."""
    traces = snapshot.get("device_traces") or []
    devices = {seg.get("device") for seg in snapshot.get("segments", []) if isinstance(seg.get("device"), int)}
    if len(devices) == 1:
        device = devices.pop()
        if 0 <= device < len(traces) and traces[device]:
            return traces[device]
    return max(traces, key=len, default=[])


def oom_events(snapshot: dict) -> list[dict]:
    """Every "oom" entry of the history: index, requested (rounded) bytes, CUDA's free bytes, stack."""
    return [
        {"index": i, "size": int(e.get("size", 0)), "device_free": e.get("device_free"), "frames": e.get("frames") or []}
        for i, e in enumerate(device_trace(snapshot))
        if e.get("action") == "oom"
    ]


def allocation_site(frames: list, script: str | None = None) -> dict:
    """Where a block was allocated: the innermost frame in ``script``, else outside torch and libraries.

    Returns ``{"label": "train.py:31", "file", "line", "function", "code"}``;
    ``code`` is the source line when the file can be read here.
    """
    frames = [f for f in frames or [] if isinstance(f, dict) and f.get("filename")]
    chosen = None
    if script:
        chosen = next((f for f in frames if _same_file(f["filename"], script)), None)
    if chosen is None:
        chosen = next((f for f in frames if not _library_frame(f["filename"])), None)
    if chosen is None:
        # No Python frame: allocated by the autograd engine's own thread (backward) or C++ internals.
        label = "no Python stack (backward pass or C++)" if not frames else "inside torch or a library"
        return {"label": label,
                "file": None, "line": None, "function": None, "code": ""}
    filename, line = chosen["filename"], int(chosen.get("line") or 0)
    return {
        "label": f"{os.path.basename(filename)}:{line}",
        "file": filename,
        "line": line,
        "function": chosen.get("name"),
        "code": linecache.getline(filename, line).strip() if line else "",
    }


def _same_file(filename: str, script: str) -> bool:
    if os.path.isabs(filename):
        return os.path.normpath(filename) == os.path.normpath(os.path.abspath(script))
    return os.path.basename(filename) == os.path.basename(script)


def _library_frame(filename: str) -> bool:
    path = filename.replace("\\", "/")
    if path.startswith("<") or not path.endswith(".py"):  # <frozen runpy>, C++ frames
        return True
    markers = ("/site-packages/", "/dist-packages/", "/torch/", "/lib/python3", "/oomlab/measure/", "/oomlab/tools/")
    return any(m in path for m in markers) or path.startswith("torch/")


def analyze(
    snapshot: dict,
    *,
    failed_request: int | None = None,
    script: str | None = None,
    budget_bytes: int | None = None,
    max_entries: int | None = None,
) -> dict:
    """Explain a snapshot: totals, segment occupancy, pinned segments, owners, timeline, verdict.

    Args:
        snapshot: what ``torch.cuda.memory._snapshot()`` returned (or :func:`load_snapshot`).
        failed_request: bytes of the request that failed; default: the last "oom" in the history.
        script: the learner's script, to name allocation sites in it rather than in torch.
        budget_bytes: the run's memory cap, for the verdict and the timeline picture.
        max_entries: the history's ring-buffer size, to tell a truncated history.

    Returns the JSON-ready dict described in the module's report (``kind``,
    ``headline``, ``culprit_bytes``, ``totals``, ``oom``, ``segments``, ``pinned``,
    ``pinned_groups``, ``owners``, ``timeline``, ``notes``).
    """
    snapshot = normalize(snapshot)
    notes: list[str] = []
    segments = [_segment_row(seg, script) for seg in snapshot["segments"]]

    reserved = sum(s["total"] for s in segments)
    free_in_pool = {pool: sum(s["free"] for s in segments if s["pool"] == pool) for pool in ("small", "large")}
    largest_in_pool = {
        pool: max((s["largest_free"] for s in segments if s["pool"] == pool), default=0) for pool in ("small", "large")
    }
    totals = {
        "reserved": reserved,
        "allocated": sum(s["live"] for s in segments),
        "requested": sum(s["requested"] for s in segments),
        "pending_free": sum(s["pending"] for s in segments),
        "free": sum(s["free"] for s in segments),
        "non_releasable": sum(s["free"] for s in segments if s["live"] or s["pending"]),
        "releasable": sum(s["total"] for s in segments if not s["live"] and not s["pending"]),
        "pinned_free": sum(s["free"] for s in segments if s["pinned"]),
        "largest_free_block": max(largest_in_pool.values()),
        "largest_free_block_small_pool": largest_in_pool["small"],
        "largest_free_block_large_pool": largest_in_pool["large"],
        "segments": len(segments),
        "segments_pinned": sum(1 for s in segments if s["pinned"]),
    }

    ooms = oom_events(snapshot)
    source = "argument" if failed_request is not None else None
    if failed_request is None and ooms:
        failed_request, source = ooms[-1]["size"], "trace"
    oom = {
        "failed_request": failed_request,
        "source": source,
        "device_free": ooms[-1]["device_free"] if ooms else None,
        "failed_at": allocation_site(ooms[-1]["frames"], script) if ooms else None,
        "events": len(ooms),
    }
    if failed_request is not None:
        pool = "small" if failed_request <= SMALL_REQUEST_MAX else "large"
        oom.update(
            pool=pool,
            free_in_pool=free_in_pool[pool],
            largest_free_in_pool=largest_in_pool[pool],
            fits_in_a_free_block=largest_in_pool[pool] >= failed_request,
            free_would_cover=free_in_pool[pool] >= failed_request,
        )
        if oom["fits_in_a_free_block"]:
            notes.append(
                "The snapshot now has a free block large enough for the failed request. It was taken after the "
                "failed operation gave back its temporaries, so that block may have been in use at the moment of "
                "the OOM; or it sits on another stream, or max_split_size_mb keeps it from being split."
            )

    pinned_rows = [s for s in segments if s["pinned"]]
    pinned_rows.sort(key=lambda s: s["free"], reverse=True)
    groups = _pinned_groups(pinned_rows)
    owners = _owners(snapshot["segments"], script)
    # The history records requested (unrounded) sizes, so it is anchored on the live blocks' requested bytes.
    timeline = _timeline(device_trace(snapshot), totals["requested"], reserved, max_entries)
    if timeline["starts_mid_run"]:
        notes.append(timeline["note"])

    result = {
        "tool": TOOL,
        "script": script,
        "budget_bytes": budget_bytes,
        "totals": totals,
        "oom": oom,
        "segments": [_public_segment(s) for s in sorted(segments, key=lambda s: s["free"], reverse=True)][
            :MAX_LISTED_SEGMENTS
        ],
        "segments_left_out": max(0, len(segments) - MAX_LISTED_SEGMENTS),
        "pinned": [
            {k: s[k] for k in ("address", "pool", "total", "live", "free", "largest_free", "pinners")}
            for s in pinned_rows[:MAX_LISTED_PINNED]
        ],
        "pinned_left_out": max(0, len(pinned_rows) - MAX_LISTED_PINNED),
        "pinned_groups": groups,
        "owners": owners[:MAX_LISTED_OWNERS],
        "owners_left_out": max(0, len(owners) - MAX_LISTED_OWNERS),
        "timeline": timeline,
        "notes": notes,
    }
    result.update(_verdict(totals, oom, groups, owners, budget_bytes))
    return result


def _segment_row(seg: dict, script: str | None) -> dict:
    """One segment's occupancy, its block layout (same-state runs merged) and its pinning blocks."""
    live = pending = free = requested = largest_free = live_blocks = 0
    layout: list[list] = []
    pinners = []
    offset = 0
    for block in seg["blocks"]:
        state = _state_of(block["state"])
        size = int(block["size"])
        if state == LIVE:
            live += size
            requested += int(block["requested_size"])
            live_blocks += 1
            pinners.append(block)
        elif state == PENDING:
            pending += size
        else:
            free += size
            largest_free = max(largest_free, size)
        if layout and layout[-1][2] == state and state != FREE:
            layout[-1][1] += size
        else:
            layout.append([offset, size, state])
        offset += size
    pinned = live_blocks > 0 and free > 0
    row = {
        "address": int(seg["address"]),
        "pool": seg["segment_type"],
        "stream": seg["stream"],
        "expandable": bool(seg.get("is_expandable", False)),
        "total": int(seg["total_size"]),
        "live": live,
        "requested": requested,
        "pending": pending,
        "free": free,
        "largest_free": largest_free,
        "live_blocks": live_blocks,
        "pinned": pinned,
        "layout": layout,
        "pinners": [],
    }
    if pinned:
        pinners.sort(key=lambda b: b["size"], reverse=True)
        row["pinners"] = [
            {"size": int(b["size"]), "requested": int(b["requested_size"]), "site": allocation_site(b["frames"], script)}
            for b in pinners[:5]
        ]
    return row


def _public_segment(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("pinners", "requested")}


def _pinned_groups(pinned_rows: list[dict]) -> list[dict]:
    """Pinned segments alike in size, pinning block and site, counted together, most stranded first."""
    groups: dict[tuple, dict] = {}
    for row in pinned_rows:
        top = row["pinners"][0]
        key = (row["total"], top["size"], top["site"]["label"], row["live_blocks"])
        group = groups.setdefault(
            key,
            {"count": 0, "segment_size": row["total"], "pinner_size": top["size"], "live_blocks": row["live_blocks"],
             "site": top["site"], "free_bytes": 0},
        )
        group["count"] += 1
        group["free_bytes"] += row["free"]
    ordered = sorted(groups.values(), key=lambda g: g["free_bytes"], reverse=True)
    for group in ordered:
        group["summary"] = _group_sentence(group)
    return ordered


def _group_sentence(group: dict) -> str:
    n, site = group["count"], group["site"]
    where = _site_text(site)
    segs = f"{n} segment{'s' if n != 1 else ''} of {size_text(group['segment_size'])} {'are each' if n != 1 else 'is'}"
    if group["live_blocks"] == 1:
        by = f"pinned by a {size_text(group['pinner_size'])} block allocated at {where}"
    else:
        by = f"pinned by {group['live_blocks']} live blocks, the largest {size_text(group['pinner_size'])} allocated at {where}"
    return f"{segs} {by}, leaving {size_text(group['free_bytes'])} free that cannot be released"


def _site_text(site: dict) -> str:
    return f"{site['label']} ({site['code']})" if site.get("code") else site["label"]


def _owners(segments: list[dict], script: str | None) -> list[dict]:
    """Live bytes grouped by allocation site, largest first."""
    by_site: dict[str, dict] = {}
    for seg in segments:
        for block in seg["blocks"]:
            if _state_of(block["state"]) != LIVE:
                continue
            site = allocation_site(block["frames"], script)
            owner = by_site.setdefault(site["label"], {**site, "site": site["label"], "bytes": 0, "blocks": 0})
            owner["bytes"] += int(block["size"])
            owner["blocks"] += 1
    return sorted(by_site.values(), key=lambda o: o["bytes"], reverse=True)


def _timeline(trace: list, end_allocated: int, end_reserved: int, max_entries: int | None) -> dict:
    """Allocated and reserved bytes after each recorded event, anchored on the snapshot's end state.

    The ring buffer keeps only the last ``max_entries`` events, so the history
    may begin mid-run: walking back from the known end state gives the right
    absolute figures either way.
    """
    deltas_alloc, deltas_res, times = [], [], []
    oom_indices = []
    for i, e in enumerate(trace):
        action = e.get("action")
        size = int(e.get("size", 0) or 0)
        deltas_alloc.append(ALLOCATED_DELTA.get(action, 0) * size)
        deltas_res.append(RESERVED_DELTA.get(action, 0) * size)
        times.append(e.get("time_us"))
        if action == "oom":
            oom_indices.append(i + 1)
    start_alloc = end_allocated - sum(deltas_alloc)
    start_res = end_reserved - sum(deltas_res)
    alloc, res = [start_alloc], [start_res]
    for da, dr in zip(deltas_alloc, deltas_res):
        alloc.append(alloc[-1] + da)
        res.append(res[-1] + dr)
    index = list(range(len(alloc)))  # point i: the state after event i (0: before the first one)

    full = max_entries is not None and len(trace) >= max_entries
    starts_mid_run = full or start_alloc > 0 or start_res > 0
    has_time = bool(trace) and all(t is not None for t in times)
    time_us = [times[0], *times] if has_time else None
    index, alloc, res, time_us = _downsample(index, alloc, res, time_us, MAX_TIMELINE_POINTS)
    if not trace:
        note = "No allocation history was recorded."
    elif starts_mid_run:
        note = (
            f"The recorded history ({len(trace)} events) starts mid-run"
            + (f" (the ring buffer keeps the last {max_entries})" if full else "")
            + f": {mib(start_alloc)} were already allocated and {mib(start_res)} reserved before its first event; "
            "figures are reconstructed backwards from the snapshot's end state."
        )
    else:
        note = f"The recorded history covers the whole run ({len(trace)} events)."
    return {
        "events": len(trace),
        "index": index,
        "allocated": alloc,
        "reserved": res,
        "time_us": time_us,
        "oom_indices": oom_indices,
        "peak_allocated": max(alloc) if alloc else 0,
        "peak_reserved": max(res) if res else 0,
        "starts_mid_run": starts_mid_run,
        "reconstructed_from_end": True,
        "allocated_means": "requested bytes of live blocks, as the history records them (allocated_bytes rounds up)",
        "note": note,
    }


def _downsample(index, alloc, res, time_us, limit):
    """At most ``limit`` points, keeping each bucket's highest values so no peak is lost."""
    n = len(index)
    if n <= limit:
        return index, alloc, res, time_us
    step = -(-n // limit)
    out_i, out_a, out_r, out_t = [], [], [], []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        peak = max(range(lo, hi), key=lambda k: (alloc[k], res[k]))
        out_i.append(index[peak])
        out_a.append(max(alloc[lo:hi]))
        out_r.append(max(res[lo:hi]))
        if time_us is not None:
            out_t.append(time_us[peak])
    return out_i, out_a, out_r, (out_t if time_us is not None else None)


def _verdict(totals: dict, oom: dict, groups: list, owners: list, budget: int | None) -> dict:
    """``kind``, ``headline`` and ``culprit_bytes``.

    fragmentation: the run failed (or reserved is high) and free space is
    stranded: the request would have fitted in the free bytes but not in any one
    free block, or non-releasable bytes are at least 20% of reserved (and at
    least 32 MiB, or 5% of the budget). live-memory: the run failed and memory
    is mostly live. none: otherwise.
    """
    request = oom["failed_request"]
    reserved, stranded = totals["reserved"], totals["non_releasable"]
    floor = 0.05 * budget if budget else STRANDED_FLOOR
    stranded_much = reserved > 0 and stranded >= max(STRANDED_SHARE * reserved, floor)
    if request is not None:
        split = oom["free_would_cover"] and not oom["fits_in_a_free_block"]
        kind = "fragmentation" if split or stranded_much else "live-memory"
    else:
        high = budget is None or reserved >= 0.5 * budget
        kind = "fragmentation" if stranded_much and high else "none"

    top_group = groups[0] if groups else None
    if kind == "fragmentation":
        if top_group:
            culprit = (
                f"{top_group['count']} segment{'s are' if top_group['count'] != 1 else ' is'} pinned by "
                f"{size_text(top_group['pinner_size'])} block{'s' if top_group['count'] != 1 else ''} from "
                f"{_site_text(top_group['site'])}"
            )
        else:
            culprit = f"{totals['segments']} segments hold free space that live blocks keep from being released"
        if request is not None:
            if oom["free_would_cover"]:
                lead = f"OOM asking for {mib(request)} with {mib(oom['free_in_pool'])} free but split"
            else:
                lead = f"OOM asking for {mib(request)} while {mib(stranded)} of reserved memory sat free but stranded"
            lead += f" (largest free block {mib(oom['largest_free_in_pool'])})"
        else:
            share = 100 * stranded / reserved
            lead = f"No OOM, but {mib(stranded)} ({share:.0f}% of {mib(reserved)} reserved) is free space stranded"
        headline = f"{lead}: {culprit}."
        return {"kind": kind, "headline": headline, "culprit_bytes": int(stranded)}
    if kind == "live-memory":
        top = owners[0] if owners else None
        biggest = f", the most ({mib(top['bytes'])} in {top['blocks']} blocks) allocated at {_site_text(top)}" if top else ""
        headline = (
            f"OOM asking for {mib(request)} with only {mib(oom['free_in_pool'])} free in the allocator's cache: "
            f"{mib(totals['allocated'])} of {mib(reserved)} reserved is live{biggest}."
        )
        return {"kind": kind, "headline": headline, "culprit_bytes": int(top["bytes"]) if top else 0}
    headline = (
        f"No fragmentation: {mib(totals['allocated'])} live in {mib(reserved)} reserved, "
        f"{mib(stranded)} free but not releasable."
    )
    return {"kind": kind, "headline": headline, "culprit_bytes": 0}


def size_text(n: int) -> str:
    """A block's size: MiB from 1 MiB up, KiB below (a 16 KiB block is not "0.0 MiB")."""
    return mib(n) if n >= MIB else f"{n / 1024:,.1f} KiB"


# --------------------------------------------------------------------------- terminal


def render(result: dict) -> list:
    """Rich renderables for the terminal: the figures, the pinned segments, the top owners."""
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(result.get("headline", ""), style="bold")]
    if result.get("error"):
        return out
    totals, oom = result["totals"], result["oom"]
    figures = Table(title="Allocator snapshot", title_justify="left", header_style="bold")
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    figures.add_column("what it means", style="dim")
    figures.add_row("reserved", mib(totals["reserved"]), f"held from the GPU in {totals['segments']} segments")
    figures.add_row("allocated", mib(totals["allocated"]), "in live blocks (tensors)")
    if totals["pending_free"]:
        figures.add_row("pending free", mib(totals["pending_free"]), "freed, waiting for another stream")
    figures.add_row("non-releasable", mib(totals["non_releasable"]), "free, but in segments a live block pins")
    figures.add_row("releasable", mib(totals["releasable"]), "whole free segments empty_cache() could return")
    figures.add_row("largest free block", mib(totals["largest_free_block"]), "the biggest request the cache could serve")
    if oom.get("failed_request") is not None:
        fits = "a free block could have held it" if oom["fits_in_a_free_block"] else "no free block could hold it"
        figures.add_row("failed request", mib(oom["failed_request"]), fits)
        if oom.get("failed_at") and oom["failed_at"].get("file"):
            figures.add_row("failed at", oom["failed_at"]["label"], oom["failed_at"].get("code") or "")
    out.append(figures)

    if result.get("pinned_groups"):
        pinned = Table(title="Segments pinned by live blocks", title_justify="left", header_style="bold")
        for name, justify in (("segments", "right"), ("segment", "right"), ("pinned by", "right"),
                              ("allocated at", "left"), ("stranded", "right")):
            pinned.add_column(name, justify=justify)
        for g in result["pinned_groups"][:10]:
            blocks = size_text(g["pinner_size"]) + (f" (+{g['live_blocks'] - 1} more)" if g["live_blocks"] > 1 else "")
            pinned.add_row(str(g["count"]), mib(g["segment_size"]), blocks, _site_text(g["site"]), mib(g["free_bytes"]))
        out.append(pinned)

    if result.get("owners"):
        owners = Table(title="Live memory by allocation site", title_justify="left", header_style="bold")
        owners.add_column("site")
        owners.add_column("MiB", justify="right")
        owners.add_column("blocks", justify="right")
        owners.add_column("code", style="cyan")
        for o in result["owners"][:10]:
            owners.add_row(o["site"], f"{o['bytes'] / MIB:,.1f}", str(o["blocks"]), o.get("code") or "")
        out.append(owners)
    for note in result.get("notes", []):
        out.append(Text(note, style="dim"))
    return out


# --------------------------------------------------------------------------- pictures

COLOURS = {LIVE: "#1f77b4", PENDING: "#ff7f0e", FREE: "#d0d0d0", "stranded": "#d62728"}


def draw(result: dict, out_dir: Path) -> list[Path]:
    """Write ``segments.png`` (the segment map) and ``timeline.png`` (memory over the run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if result.get("error"):
        return []
    paths = [_draw_segments(plt, result, out_dir / "segments.png"), _draw_timeline(plt, result, out_dir / "timeline.png")]
    return paths


def _draw_segments(plt, result: dict, path: Path) -> Path:
    from matplotlib.patches import Patch

    listed = sorted(result["segments"], key=lambda s: (s["total"], s["free"]), reverse=True)
    total_count = result["totals"]["segments"]
    shown = listed[:MAX_DRAWN_SEGMENTS]
    left_out = total_count - len(shown)
    fig, ax = plt.subplots(figsize=(12, max(3.5, 1.6 + 0.22 * len(shown))), dpi=100)
    for row, seg in enumerate(shown):
        for offset, size, state in seg["layout"]:
            colour = COLOURS["stranded"] if state == FREE and seg["pinned"] else COLOURS[state]
            ax.barh(row, size / MIB, left=offset / MIB, height=0.8, color=colour, edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([f"{s['pool']} {s['total'] / MIB:,.0f} MiB" for s in shown], fontsize=7 if len(shown) > 30 else 9)
    ax.invert_yaxis()
    ax.set_xlabel("offset in segment (MiB)")
    ax.set_ylabel("segment (pool, size)")
    where = "at the OOM" if result["oom"].get("failed_request") is not None else "at the end of the run"
    title = f"Allocator segments {where}: {len(shown)} of {total_count}, largest first"
    if left_out:
        title += f" ({left_out} smaller left out)"
    totals = result["totals"]
    ax.set_title(
        f"{title}\nreserved {mib(totals['reserved'])}, live {mib(totals['allocated'])}, "
        f"free but pinned {mib(totals['pinned_free'])}, largest free block {mib(totals['largest_free_block'])}",
        fontsize=11,
    )
    if not shown:
        ax.text(0.5, 0.5, "no segments: the allocator held no memory", ha="center", va="center", transform=ax.transAxes)
    legend = [
        Patch(color=COLOURS[LIVE], label="live block"),
        Patch(color=COLOURS[PENDING], label="pending free (other stream)"),
        Patch(color=COLOURS["stranded"], label="free, pinned by a live block"),
        Patch(color=COLOURS[FREE], label="free, releasable"),
    ]
    ax.legend(handles=legend, loc="lower right", fontsize=9, framealpha=0.9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _draw_timeline(plt, result: dict, path: Path) -> Path:
    tl = result["timeline"]
    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    x = tl["index"]
    reserved = [v / MIB for v in tl["reserved"]]
    allocated = [v / MIB for v in tl["allocated"]]
    ax.step(x, reserved, where="post", label="reserved", color="#ff7f0e")
    ax.step(x, allocated, where="post", label="allocated", color="#1f77b4")
    if x:  # the cache: reserved but not allocated
        ax.fill_between(x, allocated, reserved, step="post", color="#ff7f0e", alpha=0.15, linewidth=0,
                        label="cached: reserved, not allocated")
    budget = result.get("budget_bytes")
    if budget:
        ax.axhline(budget / MIB, color="black", linestyle="--", linewidth=1, label=f"budget {mib(budget)}")
    request = result["oom"].get("failed_request")
    for i, oom_at in enumerate(tl["oom_indices"]):
        label = f"OOM (asked for {mib(request)})" if i == len(tl["oom_indices"]) - 1 and request else None
        ax.axvline(oom_at, color="#d62728", linewidth=1.5, label=label)
    ax.set_xlabel("allocator event (position in the recorded history)")
    ax.set_ylabel("MiB")
    title = "Allocated and reserved memory over the run"
    if tl["starts_mid_run"]:
        title += f" (history starts mid-run: last {tl['events']} events)"
    ax.set_title(title, fontsize=12)
    if tl["events"] == 0:
        ax.text(0.5, 0.5, "no allocation history was recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
