"""Reading an allocator snapshot and explaining it: pure functions over plain data.

:func:`load_snapshot` reads a pickle (ours or torch's ``_dump_snapshot``) and
:func:`normalize` checks it and fills in what older torch versions leave out;
:func:`analyze` turns it into the tool's JSON-ready result: totals, the
segments' occupancy, the segments live blocks pin, who owns the live bytes,
the memory over the recorded history (:func:`timeline`), and the
:func:`verdict`. :func:`shareable` names files as a shared pickle should.

Standard library only (and oomlab's standard-library modules): the probe
imports this inside the measured process, and the tests drive it with
synthetic snapshots and no GPU.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import linecache
import os
import pickle
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.frames import is_library, is_script, portable
from oomlab.measure.nvml import outside_allocator
from oomlab.units import MIB, format_bytes

__all__ = [
    "allocation_site",
    "analyze",
    "device_trace",
    "downsample",
    "load_snapshot",
    "normalize",
    "oom_events",
    "shareable",
    "site_text",
    "state_of",
    "timeline",
    "verdict",
]

TOOL = "snapshot"
SMALL_REQUEST_MAX = 1 << 20  # kSmallSize: requests up to 1 MiB come from the small pool
MAX_TIMELINE_POINTS = 2000
MAX_LISTED_SEGMENTS = 500  # in the JSON; the totals always cover every segment
MAX_LISTED_PINNED = 100
MAX_LISTED_OWNERS = 20
MAX_LAYOUT_RUNS = 200  # runs of blocks listed per segment; the last one covers whatever is left
STRANDED_SHARE = 0.2  # stranded free space worth calling fragmentation, as a share of reserved
STRANDED_FLOOR = 32 * MIB  # ... and at least this much, so a few small-pool segments don't count

DEFAULT_POOL = (0, 0)  # the segment_pool_id of the allocator's own pool; any other is a private pool

LIVE, PENDING, FREE = "live", "pending", "free"
MIXED = "mixed"  # a layout run that covers blocks of more than one state (see MAX_LAYOUT_RUNS)
RESERVED_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
# A block stops being allocated when it is freed (free_requested); free_completed only ends the
# wait on other streams, as the snapshot's active_allocated vs active_pending_free says. Both
# entries carry the block's requested size, not its rounded size.
ALLOCATED_DELTA = {"alloc": 1, "free_requested": -1}

_FOREIGN_TODO = (
    "Take the snapshot again with torch 2.4 or newer (torch.cuda.memory._snapshot()), or run the exercise with the snapshot tool."
)


# --------------------------------------------------------------------------- reading


class _PlainDataUnpickler(pickle.Unpickler):
    """A snapshot is plain dicts, lists, strings and numbers: refuse any class or function.

    This also keeps a pickle from elsewhere from running code when we open it.
    """

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it refers to the Python object {module}.{name}")


def load_snapshot(path) -> dict:
    """Read a pickled snapshot, checked and filled in for :func:`analyze`.

    Raises :class:`oomlab.errors.OomLabError` saying what is wrong and what to
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
        # Unpickled straight from the file: a snapshot of hundreds of MB is not held twice, as bytes and as objects.
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise OomLabError(f"{path} is empty: the run stopped before the snapshot was written.", retake)
            snapshot = _PlainDataUnpickler(f).load()
    except OSError as err:
        raise OomLabError(f"Cannot read {path}: {err.strerror or err}.", "Check the file's permissions.") from None
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
        if isinstance(snapshot, dict):
            what = f"a dict with keys {sorted(map(str, snapshot))[:8]}"
        else:
            what = type(snapshot).__name__
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
    ``snapshot`` itself is left as it is: a block with nothing to fill in is
    shared with it, the others are copied.
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
    unknown = sorted(s for s in states if state_of(s) is None)
    if unknown:
        raise OomLabError(f"{where} has block states this tool does not know: {', '.join(unknown)}.", _FOREIGN_TODO)

    out_segments = []
    for seg in segments:
        blocks = []
        for block in seg["blocks"]:
            if "requested_size" in block and isinstance(block.get("frames"), list):
                blocks.append(block)  # nothing to fill in: a big snapshot is not copied block by block
                continue
            frames = block.get("frames")
            if frames is None and block.get("history"):  # torch < 2.1 kept frames in history
                frames = block["history"][0].get("frames", [])
            requested = block.get("requested_size", block["size"])
            blocks.append({**block, "requested_size": requested, "frames": frames or []})
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


def state_of(state: str) -> str | None:
    """A block's state as the analysis counts it: :data:`LIVE`, :data:`PENDING`, :data:`FREE`, or None if unknown."""
    if state == "active_allocated":
        return LIVE
    if state.startswith("active_"):  # active_pending_free; the docs spell it active_awaiting_free
        return PENDING
    if state == "inactive":
        return FREE
    return None


@contextlib.contextmanager
def shareable(snapshot: dict, root: str | None = None, labels: dict[str, str] | None = None):
    """While inside the ``with`` block, ``snapshot``'s frames name files with nothing of this machine in them.

    Every frame's ``filename`` (the segments', the blocks', a legacy block
    history's and the history entries') goes through :func:`oomlab.frames.portable`
    with ``root`` and ``labels``; on leaving the block, however it is left,
    every frame has its own name back (the analysis needs the absolute paths to
    read source lines). Yields ``snapshot``, ready to be pickled.

    The names are changed in place rather than in a copy because a snapshot
    is mostly history and little of it is frames: torch builds each distinct
    frame once and shares it between every stack that holds it, so a history of
    a million events has some thousands of frames. A copy would double the
    memory of all those events; changing the frames costs one entry per frame.
    Keep other threads off the snapshot meanwhile.
    """
    names: dict = {}  # a run has a few files and up to millions of frames: work each name out once
    seen: set[int] = set()  # ids of the frames looked at; the snapshot keeps them alive, so no id is reused
    originals: list[tuple[dict, str]] = []  # each renamed frame and its own file name

    def rename(stack) -> None:
        # Most stacks hold only frames already renamed: a set test in C spares the loop over them in Python.
        if not isinstance(stack, list) or seen.issuperset(map(id, stack)):
            return
        for frame in stack:
            if id(frame) in seen:
                continue
            seen.add(id(frame))
            if isinstance(frame, dict) and isinstance(frame.get("filename"), str):
                filename = frame["filename"]
                if filename not in names:
                    names[filename] = portable(filename, root, labels)
                originals.append((frame, filename))
                frame["filename"] = names[filename]

    def rename_in(entry) -> None:
        if isinstance(entry, dict):
            rename(entry.get("frames"))
            for older in entry.get("history") or []:
                rename_in(older)

    try:
        for seg in snapshot.get("segments") or []:
            rename_in(seg)
            if isinstance(seg, dict) and isinstance(seg.get("blocks"), list):
                for block in seg["blocks"]:
                    rename_in(block)
        for trace in snapshot.get("device_traces") or []:
            for entry in trace if isinstance(trace, list) else []:
                rename_in(entry)
        yield snapshot
    finally:
        for frame, filename in originals:
            frame["filename"] = filename


# --------------------------------------------------------------------------- what happened


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
        chosen = next((f for f in frames if _is_script(f["filename"], script)), None)
    if chosen is None:
        chosen = next((f for f in frames if not _is_library(f["filename"])), None)
    if chosen is None:
        # No Python frame: allocated by the autograd engine's own thread (backward) or C++ internals.
        label = "no Python stack (backward pass or C++)" if not frames else "inside torch or a library"
        return {"label": label, "file": None, "line": None, "function": None, "code": ""}
    filename, line = chosen["filename"], int(chosen.get("line") or 0)
    return {
        "label": f"{os.path.basename(filename)}:{line}",
        "file": filename,
        "line": line,
        "function": chosen.get("name"),
        "code": linecache.getline(filename, line).strip() if line else "",
    }


# A snapshot names a few hundred files in up to millions of frames: judge each file once.
_is_script = functools.lru_cache(maxsize=1 << 14)(is_script)
_is_library = functools.lru_cache(maxsize=1 << 14)(is_library)


def site_text(site: dict) -> str:
    """``train.py:31 (features.append(encoder(x)))``, or the label alone when the source is not at hand."""
    return f"{site['label']} ({site['code']})" if site.get("code") else site["label"]


# --------------------------------------------------------------------------- the analysis


def analyze(
    snapshot: dict,
    *,
    failed_request: int | None = None,
    script: str | None = None,
    budget_bytes: int | None = None,
    max_entries: int | None = None,
    driver: dict | None = None,
) -> dict:
    """Explain a snapshot: totals, segment occupancy, pinned segments, owners, timeline, verdict.

    Args:
        snapshot: what ``torch.cuda.memory._snapshot()`` returned (or :func:`load_snapshot`).
        failed_request: bytes of the request that failed; default: the last "oom" in the history.
        script: the learner's script, to name allocation sites in it rather than in torch.
        budget_bytes: the run's memory cap, for the verdict and the timeline picture.
        max_entries: the history's ring-buffer size, to tell a truncated history.
        driver: what the driver counted for the process when the snapshot was taken,
            ``{"reading", "start"}`` (see :mod:`oomlab.measure.nvml`); None for a snapshot
            read from a file, which does not carry it.

    Returns the JSON-ready result: ``kind``, ``headline``, ``culprit_bytes``
    (see :func:`verdict`), ``totals``, ``oom``, ``segments``, ``pinned``,
    ``pinned_groups``, ``owners``, ``timeline``, ``driver`` (the driver's figure
    beside the snapshot's reserved bytes, and what lies between them) and ``notes``.

    Its cost grows with the snapshot but its output does not: at most
    :data:`MAX_LISTED_SEGMENTS` segments of :data:`MAX_LAYOUT_RUNS` runs each,
    :data:`MAX_TIMELINE_POINTS` points, and the other lists capped alike.
    """
    snapshot = normalize(snapshot)
    notes: list[str] = []
    segments = [_segment_row(seg, script) for seg in snapshot["segments"]]

    reserved = sum(s["total"] for s in segments)
    # A request made outside a CUDA graph's capture (or a MemPool's context) cannot use a private pool's free blocks.
    own = [s for s in segments if s["private_pool"] is None]
    private = [s for s in segments if s["private_pool"] is not None]
    free_in_pool = {pool: sum(s["free"] for s in own if s["pool"] == pool) for pool in ("small", "large")}
    largest_in_pool = {pool: max((s["largest_free"] for s in own if s["pool"] == pool), default=0) for pool in ("small", "large")}
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
        "private_pools": len({tuple(s["private_pool"]) for s in private}),
        "in_private_pools": sum(s["total"] for s in private),
        "free_in_private_pools": sum(s["free"] for s in private),
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
        if private:
            notes.append(
                f"{format_bytes(totals['free_in_private_pools'])} free in private pools is not counted as free for the "
                "failed request: only what a CUDA graph records (or what runs inside the MemPool's context) is "
                "allocated there."
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
    history = timeline(device_trace(snapshot), totals["requested"], reserved, max_entries)
    if history["starts_mid_run"]:
        notes.append(history["note"])

    result = {
        "tool": TOOL,
        "script": script,
        "budget_bytes": budget_bytes,
        "totals": totals,
        "oom": oom,
        "segments": [_public_segment(s) for s in sorted(segments, key=lambda s: s["free"], reverse=True)[:MAX_LISTED_SEGMENTS]],
        "segments_left_out": max(0, len(segments) - MAX_LISTED_SEGMENTS),
        "pinned": [
            {k: s[k] for k in ("address", "pool", "total", "live", "free", "largest_free", "pinners")}
            for s in pinned_rows[:MAX_LISTED_PINNED]
        ],
        "pinned_left_out": max(0, len(pinned_rows) - MAX_LISTED_PINNED),
        "pinned_groups": groups,
        "owners": owners[:MAX_LISTED_OWNERS],
        "owners_left_out": max(0, len(owners) - MAX_LISTED_OWNERS),
        "timeline": history,
        "driver": outside_allocator(driver["reading"], reserved, driver.get("start")) if driver else None,
        "notes": notes,
    }
    result.update(verdict(totals, oom, groups, owners, budget_bytes))
    return result


def _segment_row(seg: dict, script: str | None) -> dict:
    """One segment's occupancy, its block layout (same-state runs merged) and its pinning blocks.

    The layout keeps :data:`MAX_LAYOUT_RUNS` runs; a segment cut into more (a
    small-pool segment can hold thousands of 512-byte blocks) ends in one run
    that covers the rest, :data:`MIXED` when it mixes states.
    """
    live = pending = free = requested = largest_free = live_blocks = 0
    layout: list[list] = []
    tail_states: set[str] = set()
    pinners = []
    offset = 0
    for block in seg["blocks"]:
        state = state_of(block["state"])
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
        if tail_states:  # past the cap: everything goes into the last run
            tail_states.add(state)
            layout[-1][1] += size
            layout[-1][2] = state if len(tail_states) == 1 else MIXED
        # Free blocks stay one by one: a request must fit in one of them, not in their sum.
        elif layout and layout[-1][2] == state and state != FREE:
            layout[-1][1] += size
        else:
            layout.append([offset, size, state])
            if len(layout) == MAX_LAYOUT_RUNS:
                tail_states.add(state)
        offset += size
    pinned = live_blocks > 0 and free > 0
    pool_id = tuple(seg.get("segment_pool_id") or DEFAULT_POOL)
    row = {
        "address": int(seg["address"]),
        "pool": seg["segment_type"],
        "private_pool": None if pool_id == DEFAULT_POOL else list(pool_id),
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
        row["pinners"] = [
            {"size": int(b["size"]), "requested": int(b["requested_size"]), "site": allocation_site(b["frames"], script)}
            for b in heapq.nlargest(5, pinners, key=lambda b: b["size"])
        ]
    return row


def _public_segment(row: dict) -> dict:
    """A segment as the JSON lists it; pinners go under ``pinned`` and requested bytes into the totals."""
    return {k: v for k, v in row.items() if k not in ("pinners", "requested")}


def _pinned_groups(pinned_rows: list[dict]) -> list[dict]:
    """Pinned segments alike in size, pinning block and site, counted together, most stranded first."""
    groups: dict[tuple, dict] = {}
    for row in pinned_rows:
        top = row["pinners"][0]
        key = (row["total"], top["size"], top["site"]["label"], row["live_blocks"])
        group = groups.setdefault(
            key,
            {
                "count": 0,
                "segment_size": row["total"],
                "pinner_size": top["size"],
                "live_blocks": row["live_blocks"],
                "site": top["site"],
                "free_bytes": 0,
            },
        )
        group["count"] += 1
        group["free_bytes"] += row["free"]
    ordered = sorted(groups.values(), key=lambda g: g["free_bytes"], reverse=True)
    for group in ordered:
        group["summary"] = _group_sentence(group)
    return ordered


def _group_sentence(group: dict) -> str:
    n, where = group["count"], site_text(group["site"])
    are = "are each" if n != 1 else "is"
    segs = f"{n} segment{'s' if n != 1 else ''} of {format_bytes(group['segment_size'])} {are}"
    if group["live_blocks"] == 1:
        by = f"pinned by a {format_bytes(group['pinner_size'])} block allocated at {where}"
    else:
        by = (
            f"pinned by {group['live_blocks']} live blocks, the largest {format_bytes(group['pinner_size'])} allocated at {where}"
        )
    return f"{segs} {by}, leaving {format_bytes(group['free_bytes'])} free that cannot be released"


def _owners(segments: list[dict], script: str | None) -> list[dict]:
    """Live bytes grouped by allocation site, largest first."""
    by_site: dict[str, dict] = {}
    for seg in segments:
        for block in seg["blocks"]:
            if state_of(block["state"]) != LIVE:
                continue
            site = allocation_site(block["frames"], script)
            owner = by_site.setdefault(site["label"], {**site, "site": site["label"], "bytes": 0, "blocks": 0})
            owner["bytes"] += int(block["size"])
            owner["blocks"] += 1
    return sorted(by_site.values(), key=lambda o: o["bytes"], reverse=True)


# --------------------------------------------------------------------------- over time


def timeline(trace: list, end_allocated: int, end_reserved: int, max_entries: int | None) -> dict:
    """Allocated and reserved bytes after each recorded event, anchored on the snapshot's end state.

    The ring buffer keeps only the last ``max_entries`` events, so the history
    may begin mid-run: walking back from the known end state gives the right
    absolute figures either way.

    Two passes over the history and no list as long as it: the first sums what
    the events changed (which gives the state before the first one), the
    second walks forward from there into :func:`downsample`, so a history of
    millions of events costs :data:`MAX_TIMELINE_POINTS` points of memory.
    """
    net_alloc = net_res = 0
    has_time = bool(trace)
    oom_indices = []
    for i, e in enumerate(trace):
        action = e.get("action")
        size = int(e.get("size", 0) or 0)
        net_alloc += ALLOCATED_DELTA.get(action, 0) * size
        net_res += RESERVED_DELTA.get(action, 0) * size
        if has_time and e.get("time_us") is None:
            has_time = False
        if action == "oom":
            oom_indices.append(i + 1)
    start_alloc = end_allocated - net_alloc
    start_res = end_reserved - net_res

    def states():
        """Point i: the state after event i (0: before the first one, at the first event's time)."""
        alloc, res = start_alloc, start_res
        yield 0, alloc, res, trace[0].get("time_us") if has_time else None
        for i, e in enumerate(trace, 1):
            action = e.get("action")
            size = int(e.get("size", 0) or 0)
            alloc += ALLOCATED_DELTA.get(action, 0) * size
            res += RESERVED_DELTA.get(action, 0) * size
            yield i, alloc, res, e.get("time_us") if has_time else None

    index, alloc, res, time_us = downsample(states(), len(trace) + 1, MAX_TIMELINE_POINTS)
    full = max_entries is not None and len(trace) >= max_entries
    starts_mid_run = full or start_alloc > 0 or start_res > 0
    if not trace:
        note = "No allocation history was recorded."
    elif starts_mid_run:
        note = (
            f"The recorded history ({len(trace)} events) starts mid-run"
            + (f" (the ring buffer keeps the last {max_entries})" if full else "")
            + f": {format_bytes(start_alloc)} were already allocated and {format_bytes(start_res)} reserved "
            "before its first event; figures are reconstructed backwards from the snapshot's end state."
        )
    else:
        note = f"The recorded history covers the whole run ({len(trace)} events)."
    return {
        "events": len(trace),
        "index": index,
        "allocated": alloc,
        "reserved": res,
        "time_us": time_us if has_time else None,
        "oom_indices": oom_indices,
        "peak_allocated": max(alloc) if alloc else 0,
        "peak_reserved": max(res) if res else 0,
        "starts_mid_run": starts_mid_run,
        "reconstructed_from_end": True,
        "allocated_means": "requested bytes of live blocks, as the history records them (allocated_bytes rounds up)",
        "note": note,
    }


def downsample(points, count: int, limit: int) -> tuple[list, list, list, list]:
    """At most ``limit`` of ``count`` points ``(index, allocated, reserved, time)``, keeping each bucket's highest values.

    The points come in order, as any iterable (a generator over a long history
    is never held whole). Each bucket of ``ceil(count / limit)`` consecutive
    points becomes one: the highest allocated and the highest reserved in it,
    at the index and time of its highest point, so no peak is lost.
    """
    step = max(1, -(-count // limit))
    out_i, out_a, out_r, out_t = [], [], [], []
    points = iter(points)
    while bucket := list(itertools.islice(points, step)):
        top = max(bucket, key=lambda p: (p[1], p[2]))  # the first of the highest
        out_i.append(top[0])
        out_a.append(max(p[1] for p in bucket))
        out_r.append(max(p[2] for p in bucket))
        out_t.append(top[3])
    return out_i, out_a, out_r, out_t


# --------------------------------------------------------------------------- the verdict


def _graph_pools(totals: dict, request: int | None) -> dict:
    """The verdict where private pools hold much of what is reserved (see :func:`verdict`)."""
    private, reserved, pools = totals["in_private_pools"], totals["reserved"], totals["private_pools"]
    if request is not None:
        lead = f"OOM asking for {format_bytes(request)} while {format_bytes(private)} of {format_bytes(reserved)} reserved"
    else:
        lead = f"No OOM, but {format_bytes(private)} ({100 * private / reserved:.0f}% of {format_bytes(reserved)} reserved)"
    headline = (
        f"{lead} belongs to {pools} private pool{'s' if pools != 1 else ''} "
        f"({format_bytes(totals['free_in_private_pools'])} of it free): the memory of CUDA graphs "
        '(torch.compile(mode="reduce-overhead"), torch.cuda.graph) or of a torch.cuda.MemPool. A graph replays at '
        "the addresses it recorded, so its pool keeps them while the graph lives: no other allocation can use them, "
        "and empty_cache() does not release them."
    )
    return {"kind": "graph-pools", "headline": headline, "culprit_bytes": int(private)}


def verdict(totals: dict, oom: dict, groups: list, owners: list, budget: int | None) -> dict:
    """``kind``, ``headline`` and ``culprit_bytes``.

    graph-pools: the run failed (or reserved is high) and private pools hold
    at least 20% of reserved (and at least 32 MiB, or 5% of the budget): the
    memory of CUDA graphs, or of a torch.cuda.MemPool, which no other
    allocation can use and empty_cache() does not release while they live.
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
    private_much = reserved > 0 and totals.get("in_private_pools", 0) >= max(STRANDED_SHARE * reserved, floor)
    high = budget is None or reserved >= 0.5 * budget
    if private_much and (request is not None or high):
        return _graph_pools(totals, request)
    if request is not None:
        split = oom["free_would_cover"] and not oom["fits_in_a_free_block"]
        kind = "fragmentation" if split or stranded_much else "live-memory"
    else:
        kind = "fragmentation" if stranded_much and high else "none"

    if kind == "fragmentation":
        top_group = groups[0] if groups else None
        if top_group:
            many = top_group["count"] != 1
            culprit = (
                f"{top_group['count']} segment{'s are' if many else ' is'} pinned by "
                f"{format_bytes(top_group['pinner_size'])} block{'s' if many else ''} from "
                f"{site_text(top_group['site'])}"
            )
        else:
            culprit = f"{totals['segments']} segments hold free space that live blocks keep from being released"
        if request is not None:
            if oom["free_would_cover"]:
                lead = f"OOM asking for {format_bytes(request)} with {format_bytes(oom['free_in_pool'])} free but split"
            else:
                lead = (
                    f"OOM asking for {format_bytes(request)} while {format_bytes(stranded)} of reserved memory "
                    "sat free but stranded"
                )
            lead += f" (largest free block {format_bytes(oom['largest_free_in_pool'])})"
        else:
            share = 100 * stranded / reserved
            lead = (
                f"No OOM, but {format_bytes(stranded)} ({share:.0f}% of {format_bytes(reserved)} reserved) is free space stranded"
            )
        return {"kind": kind, "headline": f"{lead}: {culprit}.", "culprit_bytes": int(stranded)}
    if kind == "live-memory":
        top = owners[0] if owners else None
        biggest = (
            f", the most ({format_bytes(top['bytes'])} in {top['blocks']} blocks) allocated at {site_text(top)}" if top else ""
        )
        headline = (
            f"OOM asking for {format_bytes(request)} with only {format_bytes(oom['free_in_pool'])} free in the "
            f"allocator's cache: {format_bytes(totals['allocated'])} of {format_bytes(reserved)} reserved is live"
            f"{biggest}."
        )
        return {"kind": kind, "headline": headline, "culprit_bytes": int(top["bytes"]) if top else 0}
    headline = (
        f"No fragmentation: {format_bytes(totals['allocated'])} live in {format_bytes(reserved)} reserved, "
        f"{format_bytes(stranded)} free but not releasable."
    )
    return {"kind": kind, "headline": headline, "culprit_bytes": 0}
