"""Step 3 of the workflow: profile the run and name the operator and line at its memory peak.

The probe wraps the learner's script in ``torch.profiler.profile`` with memory,
shapes and Python stacks recorded, and writes ``profile.json``:

- the operators that allocated the most memory;
- the memory timeline of the profiled device, by category (parameters,
  gradients, optimizer state, activations, temporaries, ...): the profiler's
  memory model names what it can; on CUDA it leaves most forward-pass tensors
  unnamed (seen with torch 2.11 on an H200), so those are named by when they
  lived (see :func:`lifetime_category`);
- the peak: when it happened, how many bytes of each category were live, the
  operator whose allocation made it, the learner's line that called it, and
  the bytes live at that moment grouped by the line that allocated them (the
  culprit is the peak's own line unless another line holds far more).

A peak made of bytes that are freed again before the optimizer step ends is a
``"transient-peak"`` (a temporary too large: fix the line); a peak that stays
is ``"steady"`` (the model, its state or something kept alive is too large).
When the run fails (an OOM), the peak is the highest point of the step that
failed, which never ended; tensors that earlier forward passes of that step
left alive (a cache, graphs kept in a list) then mark it ``"steady"``.

The memory model (``torch.profiler._memory_profiler``) and the profiler's event
tree are private APIs. Each is used behind a guard: when one is missing or
fails, the JSON says so and the analysis falls back to what is left (the
categories by lifetime alone, then the operator table alone).

The parent-side half, :func:`render` and :func:`draw`, reads only the JSON.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import linecache
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from oomlab.units import MIB

TOOL = "profile"
MAX_POINTS = 2000
TOP_OPS = 10

# Categories, in the order the chart stacks them (persistent state first). The first seven are the
# memory model's; "kept" (allocated in a step, still live after it) is ours.
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "inputs",
    "autograd_detail",
    "kept",
    "unknown",
)
_BACKWARD_OP = "autograd::engine::evaluate_function"
_CATEGORY_NAMES = {
    "PARAMETER": "parameters",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "INPUT": "inputs",
    "AUTOGRAD_DETAIL": "autograd_detail",
}
# Memory that outlives a training step; the rest is created and freed within it.
PERSISTENT = ("parameters", "gradients", "optimizer_state")


# --------------------------------------------------------------------------- probe


@dataclass
class _Session:
    """What ``start`` leaves for ``finish``: one profiled run per process."""

    torch: object
    options: dict
    prof: object = None
    steps: int = 0
    stopped: bool = False
    hook: object = None
    error: str = ""
    notes: list = field(default_factory=list)


_SESSION: _Session | None = None


def start(torch, out_dir: Path, options: dict) -> None:
    """Start profiling: CPU always, CUDA when available; memory, shapes and stacks recorded.

    ``options["max_steps"]`` stops the profiler after that many optimizer steps,
    which keeps the trace (and the time to analyse it) bounded on long runs.
    Never raises: a failure is kept and reported by :func:`finish`.
    """
    global _SESSION
    session = _Session(torch=torch, options=dict(options or {}))
    _SESSION = session
    try:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        session.prof = profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True)
        max_steps = session.options.get("max_steps")
        if max_steps:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            session.hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: _count_step(session, int(max_steps)))
        with _quiet():
            session.prof.__enter__()
    except Exception as err:  # reported in profile.json, never in the learner's run
        session.error = f"the profiler could not start: {type(err).__name__}: {err}"
        session.prof = None


@contextlib.contextmanager
def _quiet():
    """Silence the profiler's own UserWarnings: they are about the probe, not the learner's code."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.(profiler|autograd)")
        yield


def _count_step(session: _Session, max_steps: int) -> None:
    session.steps += 1
    if session.steps >= max_steps:
        _stop(session)


def _stop(session: _Session) -> None:
    """Stop the profiler once; later steps run unprofiled."""
    if session.hook is not None:
        session.hook.remove()
        session.hook = None
    if session.prof is not None and not session.stopped:
        session.stopped = True
        with _quiet():
            session.prof.__exit__(None, None, None)


def finish(torch, out_dir: Path, exc: BaseException | None, script_globals: dict | None) -> None:
    """Stop the profiler (also after an OOM), analyse what it recorded and write ``profile.json``.

    Never raises: whatever fails is recorded as ``"error"`` in the JSON.
    """
    result = {"tool": TOOL, "kind": "unknown", "headline": "", "culprit_bytes": 0}
    started = time.perf_counter()
    try:
        session = _SESSION
        if session is None:
            raise RuntimeError("profile.start() was not called before finish()")
        if session.error:
            raise RuntimeError(session.error)
        stopped_early = session.stopped
        _stop(session)
        with _quiet():
            result.update(analyse(session, exc))
        result["stopped_early"] = stopped_early
    except BaseException as err:  # the probe must never break the measurement
        result["error"] = f"{type(err).__name__}: {err}"
        result["error_traceback"] = traceback.format_exc()[-3000:]
        if not result["headline"]:
            result["headline"] = f"the profile could not be analysed: {type(err).__name__}: {err}"
    result["analysis_s"] = round(time.perf_counter() - started, 3)
    try:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{TOOL}.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    except BaseException as err:  # nothing else can be done; say so on stderr
        print(f"[oomlab] profile.json could not be written: {err}", file=sys.stderr)


# --------------------------------------------------------------------------- analysis (inside the probe)


def analyse(session: _Session, exc: BaseException | None) -> dict:
    """Turn the stopped profiler into the JSON result."""
    torch, prof, options = session.torch, session.prof, session.options
    script = os.path.abspath(options["script"]) if options.get("script") else ""
    failed = exc is not None
    oom = failed and (
        isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())) or "out of memory" in str(exc).lower()
    )
    result: dict = {
        "torch": str(torch.__version__),
        "script": script,
        "profiled_steps": session.steps if options.get("max_steps") else None,
        "max_steps": options.get("max_steps"),
        "failed": failed,
        "oom": bool(oom),
        "failed_at": _failed_at(exc, script) if failed else None,
    }
    if options.get("budget_bytes"):
        result["budget_bytes"] = int(options["budget_bytes"])
    notes: list[str] = []

    tree = None
    try:
        tree = prof.profiler.kineto_results.experimental_event_tree()
    except Exception as err:
        notes.append(f"the profiler's event tree is unavailable ({type(err).__name__}: {err}): no timeline, no peak")
    events = list(_walk(tree)) if tree is not None else []
    allocations = _allocation_events(events)
    device = options.get("device") or _profiled_device(allocations)
    result["device"] = device
    result["top_ops"], result["top_ops_metric"] = _top_ops(prof, device, notes)

    # The timeline: every allocation and free on the device, each with its tensor's category.
    dev_allocs = [a for a in allocations if a[3] == device]
    step_ends = sorted(e.end_time_ns for e in events if _is_op(e) and e.name.startswith("Optimizer.step#"))
    result["steps_seen"] = len(step_ends)
    calls = _python_calls(events, script)
    categories, model = _categorize(prof, events, dev_allocs, step_ends, failed, script, calls, notes)
    result["memory_model"] = model
    deltas = [(a[0], category, a[1]) for a, category in zip(dev_allocs, categories) if category is not None]
    source = "categories" if tree is not None else "none"
    times, levels = coalesce(deltas)
    if not times:
        result["timeline"] = {"source": source, "times_ms": [], "bytes": {}, "total": [], "step_ends_ms": []}
        result["peak"] = None
        result["notes"] = notes + ["no memory was allocated on the profiled device while profiling"]
        result["headline"] = f"no memory was allocated on {device} while the profiler ran"
        if result["top_ops"]:
            result["headline"] += f"; the largest operator was {result['top_ops'][0]['op']}"
        return result

    t0 = times[0]
    totals = total_levels(levels)
    window_start = step_ends[-1] if failed and step_ends and step_ends[-1] < times[-1] else None
    i = peak_index(times, totals, after=window_start)
    peak = {
        "time_ms": (times[i] - t0) / 1e6,
        "total_bytes": totals[i],
        "by_category": {c: levels[c][i] for c in CATEGORIES if levels[c][i]},
        "in_failed_step": window_start is not None or (failed and not step_ends),
    }
    after = level_after(times, totals, step_ends, times[i], failed)
    peak["level_after_step_bytes"] = after
    peak["freed_after_peak_bytes"] = None if after is None else max(0, totals[i] - after)
    earlier = [s for s in step_ends if s < times[i]]
    before = level_at(times, totals, earlier[-1]) if earlier else None
    site, live = _peak_site(dev_allocs, times[i], script, calls)
    peak.update(site)
    carried = None
    if after is None and live:
        # A step that never ended: do tensors from earlier forward passes of it survive (a cache, kept graphs)?
        forwards = _forward_passes(events)
        allocated_at = {index: dev_allocs[index][0] for index in live}
        carried = carried_bytes(forwards, live, allocated_at, earlier[-1] if earlier else None, times[i])
    peak["carried_from_earlier_forwards_bytes"] = carried
    kind, basis = classify(totals[i], after, before, peak["by_category"], model["available"], carried)
    peak["kind_basis"] = basis
    if failed:
        t_fail, live_at_fail = failure_point(dev_allocs, times, totals)
        result["failure"] = {
            "time_ms": (t_fail - t0) / 1e6,
            "live_bytes": live_at_fail,
            "request_bytes": requested_bytes(str(exc)),
        }
    run_peak = peak_index(times, totals)
    result["run_peak"] = {"time_ms": (times[run_peak] - t0) / 1e6, "total_bytes": totals[run_peak]}
    result["peak"] = peak
    result["kind"] = kind
    result["culprit_bytes"] = int((peak.get("culprit") or {}).get("bytes") or 0)
    result["timeline"] = {
        "source": source,
        "points_before_downsampling": len(times),
        **downsample(times, levels, t0, MAX_POINTS),
        "step_ends_ms": [(t - t0) / 1e6 for t in step_ends][:MAX_POINTS],
    }
    result["notes"] = notes
    result["headline"] = headline(result)
    return result


def _walk(roots):
    """Every event of the profiler's event tree, parents before children (iterative: deep trees)."""
    stack = list(reversed(roots or []))
    while stack:
        event = stack.pop()
        yield event
        stack.extend(reversed(event.children))


def _event_type(event) -> str:
    return event.typed[0].name if hasattr(event.typed[0], "name") else str(event.typed[0]).rsplit(".", 1)[-1]


def _is_op(event) -> bool:
    return _event_type(event) == "TorchOp"


def _allocation_events(events) -> list[tuple]:
    """``(t_ns, signed bytes, ptr, device, allocator total, event)`` for every allocation and free, in time order."""
    out = []
    for event in events:
        if _event_type(event) != "Allocation":
            continue
        fields = event.typed[1]
        out.append((event.start_time_ns, int(fields.alloc_size), int(fields.ptr), str(fields.device), int(fields.total_allocated), event))
    out.sort(key=lambda a: a[0])
    return out


def _profiled_device(allocations) -> str:
    """The GPU when the run allocated on one (the budget is there), else the CPU."""
    for device in sorted({a[3] for a in allocations}):
        if device.startswith("cuda"):
            return device
    return "cpu"


def _categorize(prof, events, dev_allocs, step_ends, failed: bool, script: str, calls, notes: list) -> tuple[list, dict]:
    """The category of every allocation on the device; a free gets its allocation's (``None``: not drawn).

    The memory model's category when it has one; else the category the
    tensor's lifetime gives (:func:`lifetime_category`); else, for a tensor of
    the failed step whose fate nobody saw, the category that tensors from the
    same operator, line and size had in the completed steps.
    """
    model: dict = {"available": False, "error": None}
    known = None
    try:
        known = _model_categories(prof)
        model["available"] = True
    except Exception as err:
        model["error"] = f"{type(err).__name__}: {err}"
        notes.append(f"the profiler's memory model failed ({model['error']}): parameters, gradients and optimizer state are not told apart")
    backward_starts = sorted(e.start_time_ns for e in events if _is_op(e) and e.name.startswith(_BACKWARD_OP))
    optimizer_calls = sorted((e.start_time_ns, e.end_time_ns) for e in events if _is_op(e) and e.name.startswith("Optimizer."))
    freed_at = free_times([(a[0], a[1], a[2]) for a in dev_allocs])
    # The end of what was seen: the last allocation before the failure, or the last event.
    t_end = next((a[0] for a in reversed(dev_allocs) if a[1] > 0 or not failed), 0)
    categories: list = [None] * len(dev_allocs)
    by_source = dict.fromkeys(("memory_model", "lifetime", "earlier_steps", "unknown"), 0)
    learned: dict[tuple, str] = {}
    live: dict[int, str] = {}
    for index, (t, size, ptr, _, _, event) in enumerate(dev_allocs):
        if size < 0:
            categories[index] = live.pop(ptr, None)  # None: allocated before the profiler started
            continue
        category = known(event.typed[1]) if known else None
        source = "memory_model"
        if category is None:
            phase = _phase(event, optimizer_calls)
            category = lifetime_category(phase, t, freed_at.get(index), backward_starts, step_ends, t_end)
            source = "lifetime"
            if phase == "forward":
                site = _site_of(event, calls, script)
                signature = (site["op"], site["file"], site["line"], size)
                if category is not None:
                    learned[signature] = category
                elif failed:
                    category = learned.get(signature)
                    source = "earlier_steps"
        if category is None:
            category, source = "unknown", "unknown"
        categories[index] = live[ptr] = category
        by_source[source] += size
    model["bytes_categorized_by"] = by_source
    if by_source["lifetime"] + by_source["earlier_steps"]:
        notes.append(
            f"the memory model named {by_source['memory_model'] / MIB:,.0f} MiB of the allocations; "
            f"{by_source['lifetime'] / MIB:,.0f} MiB were named by when they lived "
            "(forward to backward: activations; freed before backward: temporaries; made by backward: autograd detail; "
            "made by the optimizer and kept: optimizer state; made in forward or backward and still live after the step: kept)"
            + (f", {by_source['earlier_steps'] / MIB:,.0f} MiB of the failed step as in the steps before it" if by_source["earlier_steps"] else "")
        )
    return categories, model


def _model_categories(prof):
    """A lookup from an allocation's fields to the memory model's category name, or ``None`` when it has none.

    Raises when the private API is missing. A tensor whose category changes
    between versions keeps the category of its earliest version that has one.
    """
    from torch.profiler import _memory_profiler as mp

    snapshot = mp.MemoryProfile(prof.profiler.kineto_results)._category_snapshot()
    by_key: dict = {}
    for (key, _version), category in sorted(snapshot.items(), key=lambda kv: kv[0][1]):
        if category is not None and key not in by_key:
            by_key[key] = _CATEGORY_NAMES.get(category.name)

    def lookup(fields):
        key = mp.TensorKey.from_allocation(fields)
        return by_key.get(key) if key is not None else None

    return lookup


def _phase(event, optimizer_calls: list[tuple[int, int]]) -> str:
    """``"backward"`` when an autograd node made the allocation, ``"optimizer"`` when an optimizer call did, else ``"forward"``.

    Optimizer calls are found by time: their ``record_function`` ranges are
    not always ancestors of the allocations made inside them.
    """
    node = event.parent
    while node is not None:
        if _is_op(node) and node.name.startswith(_BACKWARD_OP):
            return "backward"
        node = node.parent
    t = event.start_time_ns
    k = bisect.bisect_right(optimizer_calls, (t, float("inf"))) - 1
    if k >= 0 and optimizer_calls[k][1] >= t:
        return "optimizer"
    return "forward"


def lifetime_category(phase: str, t: int, freed: int | None, backward_starts: list[int], step_ends: list[int], t_end: int) -> str | None:
    """A tensor's category from when it was allocated and freed, for what the memory model could not name.

    - allocated by an autograd node: ``autograd_detail`` (gradients of
      activations and the buffers backward needs), or ``kept`` when it
      outlives the step: a ``.grad`` the memory model did not name, or a
      library's workspace (cuBLAS keeps one per thread, and backward runs on
      its own thread);
    - allocated by an optimizer call: ``optimizer_state`` when it outlives the
      step, else ``temporaries`` (its scratch);
    - allocated in a forward pass (the rest) and freed before the next backward
      starts: ``temporaries``; freed by the end of the step that backward is
      part of: ``activations``; still live after that step: ``kept``;
    - with no backward after it: freed before the end (``t_end``, the failure
      in a failed run): ``temporaries``; else ``None``: nobody saw its fate.
    """
    if phase in ("backward", "optimizer"):
        j = bisect.bisect_left(step_ends, t)
        step_end = step_ends[j] if j < len(step_ends) else t_end
        outlives = freed is None or freed > step_end
        if phase == "backward":
            return "kept" if outlives else "autograd_detail"
        return "optimizer_state" if outlives else "temporaries"
    k = bisect.bisect_right(backward_starts, t)
    if k < len(backward_starts):
        backward = backward_starts[k]
        if freed is not None and freed <= backward:
            return "temporaries"
        j = bisect.bisect_left(step_ends, backward)
        step_end = step_ends[j] if j < len(step_ends) else None
        if freed is None or (step_end is not None and freed > step_end):
            return "kept"
        return "activations"
    if freed is not None and freed < t_end:
        return "temporaries"
    return None


def free_times(allocs) -> dict[int, int]:
    """``{index of an allocation: time it was freed}`` for ``(t, signed bytes, ptr)`` events in time order."""
    live: dict[int, int] = {}
    freed: dict[int, int] = {}
    for index, (when, size, ptr) in enumerate(allocs):
        if size > 0:
            live[ptr] = index
        elif ptr in live:
            freed[live.pop(ptr)] = when
    return freed


def _top_ops(prof, device: str, notes: list) -> tuple[list[dict], str]:
    """The operators that allocated the most, grouped by the operator the program called.

    ``key_averages()`` credits every byte to ``aten::empty`` or
    ``aten::empty_strided`` (the ops that call the allocator), which names no
    culprit. So each allocation is credited to the outermost ``aten::`` op
    around it: the one the learner's code, autograd or the optimizer called
    (``aten::one_hot``, ``aten::to``, ``aten::mm``). Its bytes are the net
    bytes allocated during the call, the ops it called included: its outputs.
    """
    metric = "net bytes allocated by the call (its outputs), ops it called included"
    cuda = device.startswith("cuda")
    try:
        events = prof.events()
    except Exception as err:
        notes.append(f"the profiler's operator events are unavailable ({type(err).__name__}: {err})")
        return [], metric
    table: dict[str, dict] = {}
    for event in events:
        name = event.name
        if not name.startswith("aten::"):
            continue
        parent = getattr(event, "cpu_parent", None)
        if parent is not None and parent.name.startswith("aten::"):
            continue  # counted in its outermost aten:: caller
        if cuda:
            nbytes = _first_attr(event, ("device_memory_usage", "cuda_memory_usage"))
        else:
            nbytes = _first_attr(event, ("cpu_memory_usage",))
        row = table.setdefault(name, {"op": name, "calls": 0, "bytes": 0, "largest_call_bytes": 0, "input_shapes": None})
        row["calls"] += 1
        if nbytes > 0:
            row["bytes"] += nbytes
            if nbytes > row["largest_call_bytes"]:
                row["largest_call_bytes"] = nbytes
                row["input_shapes"] = [list(s) if isinstance(s, (list, tuple)) else s for s in (event.input_shapes or [])]
    rows = sorted((r for r in table.values() if r["bytes"] > 0), key=lambda r: -r["bytes"])
    return rows[:TOP_OPS], metric


def _first_attr(obj, names) -> int:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return int(value)
    return 0


def _peak_site(dev_allocs, t_peak: int, script: str, calls) -> dict:
    """The allocation that made the peak, its operator and the learner's line; bytes live at the peak by line."""
    nothing = {"op": None, "file": None, "line": None, "text": "", "site_via": None, "culprit": None}
    if not dev_allocs:
        return nothing, {}
    times = [a[0] for a in dev_allocs]
    upto = bisect.bisect_right(times, t_peak)
    candidates = [a for a in dev_allocs[:upto] if a[1] > 0]
    if not candidates:
        return nothing, {}
    last_t = candidates[-1][0]
    alloc = max((a for a in candidates if a[0] == last_t), key=lambda a: a[1])
    site = _site_of(alloc[5], calls, script)
    site["allocation_bytes"] = alloc[1]
    site["allocator_total_bytes"] = alloc[4]

    # Which lines the bytes live at the peak came from: the line to change, and what it costs.
    live = live_allocations([(a[0], a[1], a[2]) for a in dev_allocs], t_peak)
    by_line: dict[tuple, int] = {}
    cache: dict[int, dict] = {}
    for index, size in live.items():
        event = dev_allocs[index][5]
        where = cache.setdefault(id(event), _site_of(event, calls, script))
        key = (where["file"], where["line"], where["text"])
        by_line[key] = by_line.get(key, 0) + size
    ranked = sorted(by_line.items(), key=lambda kv: -kv[1])
    site["by_line"] = [{"file": f, "line": n, "text": text, "bytes": b} for (f, n, text), b in ranked[:8]]
    site["line_bytes"] = by_line.get((site["file"], site["line"], site["text"]), 0) if site["line"] else 0
    site["culprit"] = choose_culprit(site, site["by_line"])
    return site, live


def choose_culprit(site: dict, by_line: list[dict]) -> dict | None:
    """The line to blame: the peak's own line, unless another line holds more than twice its bytes at the peak.

    The allocation that tips the peak can be small (a label tensor) while a
    list of kept tensors holds most of it; then that list's line is the culprit.
    """
    ranked = [row for row in by_line if row.get("line")]
    own = {"file": site.get("file"), "line": site.get("line"), "text": site.get("text", ""), "bytes": site.get("line_bytes", 0)}
    if not ranked:
        return own if own["line"] else None
    top = ranked[0]
    if own["line"] and own["bytes"] * 2 >= top["bytes"]:
        return own
    return dict(top)


def _python_calls(events, script: str) -> _Calls:
    """``(start, end, frame)`` for the Python calls made from a user file, for time-based lookup.

    Allocations made on autograd's device thread have no Python frames above
    them; the call that covers them in time (``loss.backward()``) names the line.
    """
    calls = []
    for event in events:
        if _event_type(event) not in ("PyCall", "PyCCall"):
            continue
        frame = _frame(event.typed[1].caller, script)
        if frame["user"]:
            calls.append((event.start_time_ns, event.end_time_ns, frame))
    return _Calls(calls)


def _forward_passes(events) -> list[tuple[int, int]]:
    """``(start, end)`` of every outermost ``nn.Module`` call (a model's forward pass), in time order."""
    passes = []
    for event in events:
        if _event_type(event) != "PyCall" or getattr(event.typed[1], "module", None) is None:
            continue
        node, nested = event.parent, False
        while node is not None and not nested:
            nested = _event_type(node) == "PyCall" and getattr(node.typed[1], "module", None) is not None
            node = node.parent
        if not nested:
            passes.append((event.start_time_ns, event.end_time_ns))
    passes.sort()
    return passes


def _site_of(event, calls, script: str) -> dict:
    """Operator, context and source line of one allocation event."""
    op, context, frames = None, None, []
    node = event.parent
    while node is not None:
        kind = _event_type(node)
        if kind == "TorchOp":
            if node.name.startswith("aten::") and not frames and context is None:
                op = node.name  # the outermost aten:: op of the innermost run of ops
            elif context is None and not node.name.startswith("aten::"):
                context = node.name  # e.g. "autograd::engine::evaluate_function: MulBackward0", "Optimizer.step#AdamW.step"
        elif kind in ("PyCall", "PyCCall"):
            frames.append(_frame(node.typed[1].caller, script))
        node = node.parent
    chosen = next((f for f in frames if f["script"]), None) or next((f for f in frames if f["user"]), None)
    via = "stack" if chosen else None
    if chosen is None:
        chosen = covering_call(calls, event.start_time_ns)
        via = "time" if chosen else None
    site = {"op": op, "context": context, "site_via": via, "file": None, "line": None, "function": None, "text": ""}
    if chosen:
        site.update(file=chosen["file"], line=chosen["line"], function=chosen["function"], text=chosen["text"])
    site["stack"] = [f"{f['file']}:{f['line']} in {f['function']}" for f in frames[:8]]
    return site


def covering_call(calls: list[tuple], t: int, scan: int = 5000) -> dict | None:
    """The innermost user call running at time ``t``, preferring the learner's script; ``calls`` sorted by start.

    Calls nest, so the innermost covering call is the latest-starting one that
    has not ended; the backward scan from ``t`` stops after ``scan`` calls.
    """
    starts = getattr(calls, "starts", None) or [c[0] for c in calls]
    last = bisect.bisect_right(starts, t) - 1
    fallback = None
    for k in range(last, max(-1, last - scan), -1):
        start, end, frame = calls[k]
        if end >= t:
            if frame["script"]:
                return frame
            fallback = fallback or frame
    return fallback


class _Calls(list):
    """A list of ``(start, end, frame)`` sorted by start, with its starts kept for bisection."""

    def __init__(self, calls):
        super().__init__(sorted(calls, key=lambda c: c[0]))
        self.starts = [c[0] for c in self]


_FRAME_CACHE: dict = {}


def _frame(location, script: str) -> dict:
    """A profiler code location as ``file``/``line``/``function``/``text``, and whether it is the learner's code.

    The profiler shortens file names relative to ``sys.path`` (``train.py``,
    ``torch/nn/modules/linear.py``), so the full path is found again through
    ``sys.path`` and the script's folder before reading the line.
    """
    name = _read(location, "file_name", "?")
    line = _read(location, "line_number", 0)
    function = _read(location, "function_name", "?")
    key = (name, line, function, script)
    if key in _FRAME_CACHE:
        return _FRAME_CACHE[key]
    path = _resolve(name, script)
    in_script = bool(script and path and os.path.abspath(path) == script)
    norm = (path or name).replace(os.sep, "/")
    library = (
        name.startswith(("torch/", "<"))
        or "/site-packages/" in norm
        or "/dist-packages/" in norm
        or "/oomlab/" in norm
        or "/lib/python" in norm
        or norm.endswith("/runpy.py")
    )
    text = linecache.getline(path, line).strip() if path else ""
    frame = {
        "file": os.path.basename(name) if in_script else name,
        "path": path,
        "line": line,
        "function": function,
        "text": text,
        "script": in_script,
        "user": in_script or not library,
    }
    _FRAME_CACHE[key] = frame
    return frame


def _read(location, attribute: str, default):
    """One field of a profiler code location; some torch builds return undecodable names."""
    try:
        return getattr(location, attribute)
    except (UnicodeDecodeError, AttributeError, RuntimeError):
        return default


def _resolve(name: str, script: str) -> str | None:
    if os.path.isabs(name):
        return name if os.path.exists(name) else None
    if name.startswith("<"):
        return None
    roots = [os.path.dirname(script)] if script else []
    roots += [p or os.getcwd() for p in sys.path]
    for root in roots:
        candidate = os.path.join(root, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def _failed_at(exc: BaseException, script: str) -> dict | None:
    """The learner's line where the exception passed last."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if script and os.path.abspath(f.filename) == script]
    if not frames:
        return None
    last = frames[-1]
    return {"file": os.path.basename(last.filename), "line": last.lineno, "text": (last.line or "").strip()}


# --------------------------------------------------------------------------- pure functions over plain data


def coalesce(deltas) -> tuple[list[int], dict[str, list[int]]]:
    """``(t, category, signed bytes)`` events -> distinct times and the live bytes per category after each.

    Events at the same time are applied together, as the profiler's own
    timeline does, so a tensor that changes category does not make a spike.
    """
    ordered = sorted(deltas, key=lambda d: d[0])
    times: list[int] = []
    levels = {c: [] for c in CATEGORIES}
    current = dict.fromkeys(CATEGORIES, 0)
    for index, (t, category, delta) in enumerate(ordered):
        current[category if category in current else "unknown"] += int(delta)
        if index + 1 == len(ordered) or ordered[index + 1][0] != t:
            times.append(t)
            for c in CATEGORIES:
                levels[c].append(current[c])
    return times, levels


def total_levels(levels: dict[str, list[int]]) -> list[int]:
    columns = [levels[c] for c in CATEGORIES if c in levels]
    return [sum(values) for values in zip(*columns)]


def peak_index(times: list[int], totals: list[int], after: int | None = None) -> int:
    """Index of the highest total (the first, if tied); only from ``after`` on when given (the failed step)."""
    start = bisect.bisect_right(times, after) if after is not None else 0
    if start >= len(totals):
        start = 0
    best = start
    for i in range(start, len(totals)):
        if totals[i] > totals[best]:
            best = i
    return best


def level_at(times: list[int], totals: list[int], t: int) -> int:
    """The total live after the last event at or before ``t``."""
    i = bisect.bisect_right(times, t) - 1
    return totals[i] if i >= 0 else 0


def level_after(times: list[int], totals: list[int], step_ends: list[int], t_peak: int, failed: bool) -> int | None:
    """What is still live when the step that contains the peak ends.

    After the last optimizer step (or in a run without any) the end of the
    profile stands in for the step end; a step that never ended because the
    run failed in it has no such level: ``None``.
    """
    later = [s for s in step_ends if s >= t_peak]
    if later:
        return level_at(times, totals, later[0])
    return None if failed else totals[-1]


def classify(
    peak_total: int,
    after: int | None = None,
    before: int | None = None,
    by_category: dict | None = None,
    categorized: bool = False,
    carried: int | None = None,
) -> tuple[str, str]:
    """``"transient-peak"`` or ``"steady"``, and what the verdict rests on.

    A peak is transient when at least half of it is freed again before its
    step ends (``after``: the level at that step end). When the step never
    ended (the run failed in it) nobody knows what would have been freed, so:

    - if tensors from earlier forward passes of the step are still live and
      make at least a quarter of what the step added (``carried``), memory
      accumulates: steady (a healthy loop keeps next to nothing from one
      forward pass to the next: backward or ``no_grad`` frees it);
    - else the bytes the step added stand in for what it would have freed:
      the peak minus the level at the previous step end (``before``), or, in
      the first step, minus the parameters, gradients and optimizer state.
    """
    if peak_total <= 0:
        return "steady", "nothing was allocated"
    if after is not None:
        freed = peak_total - after
        return ("transient-peak" if freed * 2 >= peak_total else "steady"), "level at the step end"
    if before is not None:
        basis = "bytes allocated within the failed step (above the level at the previous step end)"
    elif categorized:
        before = sum((by_category or {}).get(c, 0) for c in PERSISTENT)
        basis = "bytes allocated within the failed first step (above parameters, gradients and optimizer state)"
    else:
        return "steady", "unknown: the step never ended and the memory has no categories"
    new_bytes = peak_total - before
    if carried is not None and carried * 4 >= new_bytes > 0:
        return "steady", "tensors from earlier forward passes of the failed step are still live: memory accumulates"
    return ("transient-peak" if new_bytes * 2 >= peak_total else "steady"), basis


def carried_bytes(forwards, live: dict[int, int], allocated_at: dict[int, int], window_start: int | None, t_peak: int) -> int | None:
    """Bytes live at the peak that earlier forward passes of the failed step allocated.

    ``forwards`` are ``(start, end)`` of the outermost module calls. With one
    forward pass in the step there is nothing to compare: ``None``. Tensors a
    finished forward pass left behind and that are still live many passes
    later are being kept (a cache, graphs kept through a list), not freed at
    the step's end.
    """
    lo = window_start if window_start is not None else float("-inf")
    in_step = [f for f in forwards if lo <= f[0] <= t_peak]
    if len(in_step) < 2:
        return None
    current = in_step[-1][0]
    finished = [f for f in in_step[:-1] if f[1] <= current]
    starts = [f[0] for f in finished]
    carried = 0
    for index, size in live.items():
        t = allocated_at[index]
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0 and t <= finished[k][1]:
            carried += size
    return carried


def failure_point(allocs, times: list[int], totals: list[int]) -> tuple[int, int]:
    """When the run failed and what was live then: the last successful allocation and the allocator's total after it.

    The timeline's last point comes later, after the exception unwound the
    frames and freed their temporaries, and would understate what was live.
    ``allocs`` are ``(t, signed bytes, ptr, device, allocator total, ...)``.
    """
    last = next((a for a in reversed(allocs) if a[1] > 0), None)
    if last is None:
        return times[-1], totals[-1]
    return last[0], last[4] if last[4] > 0 else level_at(times, totals, last[0])


def requested_bytes(message: str) -> int | None:
    """The size in an OOM message's "Tried to allocate 512.00 MiB", in bytes."""
    match = re.search(r"Tried to allocate ([\d.]+) ?(GiB|MiB|KiB|B|bytes)", message)
    if not match:
        return None
    scale = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1, "bytes": 1}[match.group(2)]
    return int(float(match.group(1)) * scale)


def live_allocations(allocs, t: int) -> dict[int, int]:
    """``{index: bytes}`` of allocations live after time ``t``; ``allocs`` are ``(t, signed bytes, ptr)`` in time order.

    Frees are paired with allocations by :func:`free_times`; frees of memory
    allocated before the profiler started match nothing and are ignored.
    """
    freed = free_times(allocs)
    return {
        index: size
        for index, (when, size, _) in enumerate(allocs)
        if size > 0 and when <= t and freed.get(index, t + 1) > t
    }


def downsample(times: list[int], levels: dict[str, list[int]], t0: int, max_points: int) -> dict:
    """At most ``max_points`` points, in ms from ``t0``; each bucket keeps its lowest and highest total.

    Keeping both extremes of every bucket keeps the peak exactly and the
    troughs between steps, which a plain stride would skip.
    """
    totals = total_levels(levels)
    n = len(times)
    if n <= max_points:
        keep = list(range(n))
    else:
        buckets = max(1, max_points // 2)
        keep = []
        for b in range(buckets):
            lo, hi = b * n // buckets, (b + 1) * n // buckets
            if lo >= hi:
                continue
            span = range(lo, hi)
            low = min(span, key=lambda i: totals[i])
            high = max(span, key=lambda i: totals[i])
            keep.extend(sorted({low, high}))
    return {
        "times_ms": [(times[i] - t0) / 1e6 for i in keep],
        "bytes": {c: [levels[c][i] for i in keep] for c in CATEGORIES if any(levels[c])},
        "total": [totals[i] for i in keep],
    }


def mib(n: float | int | None) -> str:
    return "n/a" if n is None else f"{n / MIB:,.0f}"


def _label(category: str) -> str:
    return category.replace("_", " ")


def where(peak: dict) -> str:
    return f"{peak['file']}:{peak['line']}" if peak and peak.get("line") else ""


def headline(result: dict) -> str:
    """One sentence: the peak, its operator and the line to blame, with figures."""
    peak = result.get("peak")
    if not peak:
        return result.get("headline") or "no memory peak was recorded"
    op = peak.get("op") or peak.get("context") or "an unnamed operation"
    culprit = peak.get("culprit") or {}
    own = {"file": peak.get("file"), "line": peak.get("line")}
    sentence = f"the peak, {mib(peak['total_bytes'])} MiB, "
    if not peak.get("line"):
        sentence += f"comes from {op} (no source line was recorded)"
    elif culprit and (culprit["file"], culprit["line"]) != (own["file"], own["line"]):
        sentence += (
            f"is reached in {op} at {where(peak)}, but {culprit['file']}:{culprit['line']} ({culprit['text']}) "
            f"allocated the most of it, {mib(culprit['bytes'])} MiB"
        )
    else:
        sentence += f"comes from {op} at {where(peak)}"
        if peak.get("text"):
            sentence += f" ({peak['text']})"
        if culprit.get("bytes"):
            sentence += f": tensors allocated on that line hold {mib(culprit['bytes'])} MiB of it"
    by_category = peak.get("by_category") or {}
    if by_category:
        largest = max(by_category, key=by_category.get)
        if largest != "unknown":  # uncategorized bytes (common on CUDA, and in a step cut short) explain nothing
            sentence += f"; {_label(largest)} are {mib(by_category[largest])} MiB of it"
    if not result.get("oom"):
        return sentence

    failed = result.get("failed_at")
    failure = result.get("failure") or {}
    at = f" at {failed['file']}:{failed['line']}" if failed else ""
    asking = ""
    if failure.get("request_bytes"):
        asking = f" asking for {mib(failure['request_bytes'])} MiB more with {mib(failure.get('live_bytes'))} MiB live"
    sentence = f"the run ran out of memory{at}{asking}; in the failed step " + sentence
    budget = result.get("budget_bytes")
    if budget and failure.get("request_bytes") and failure.get("live_bytes", 0) + failure["request_bytes"] <= budget:
        sentence += (
            f"; live tensors plus the request fit in the {mib(budget)} MiB budget, "
            "so the rest was held by the allocator's cache or lost to fragmentation"
        )
    return sentence


# --------------------------------------------------------------------------- parent side


def render(result: dict) -> list:
    """The top operators and the peak, for the terminal (rich renderables)."""
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(result.get("headline", ""), style="bold")]
    if result.get("error"):
        out.append(Text(f"profile error: {result['error']}", style="red"))
    ops = Table(title="Operators that allocated the most", title_justify="left", header_style="bold")
    ops.add_column("operator")
    ops.add_column("calls", justify="right")
    ops.add_column("MiB", justify="right")
    ops.add_column("input shapes (largest call)", style="dim")
    for row in result.get("top_ops") or []:
        ops.add_row(row["op"], str(row["calls"]), f"{row['bytes'] / MIB:,.1f}", _shapes(row.get("input_shapes")))
    out.append(ops)

    peak = result.get("peak")
    if peak:
        text = Text()
        text.append("Peak: ", style="bold")
        text.append(f"{peak['total_bytes'] / MIB:,.1f} MiB at {peak['time_ms']:,.1f} ms" + (" (in the failed step)" if peak.get("in_failed_step") else "") + "\n")
        text.append("operator: ", style="bold")
        text.append(f"{peak.get('op') or 'n/a'}" + (f"  ({peak['context']})" if peak.get("context") else "") + "\n")
        text.append("line: ", style="bold")
        text.append(f"{where(peak) or 'n/a'}  {peak.get('text') or ''}\n")
        culprit = peak.get("culprit") or {}
        if culprit.get("line"):
            text.append("culprit: ", style="bold")
            text.append(f"{culprit['file']}:{culprit['line']}  {culprit.get('text') or ''}  ({culprit['bytes'] / MIB:,.1f} MiB live at the peak)\n")
        text.append("kind: ", style="bold")
        text.append(f"{result.get('kind', '')} ({peak.get('kind_basis', '')})")
        failure = result.get("failure") or {}
        if failure.get("request_bytes"):
            text.append("\nfailed request: ", style="bold")
            text.append(f"{failure['request_bytes'] / MIB:,.1f} MiB with {failure['live_bytes'] / MIB:,.1f} MiB live")
        out.append(text)
        cats = Table(title="Live at the peak", title_justify="left", header_style="bold")
        cats.add_column("category")
        cats.add_column("MiB", justify="right")
        for category, nbytes in sorted(peak.get("by_category", {}).items(), key=lambda kv: -kv[1]):
            cats.add_row(_label(category), f"{nbytes / MIB:,.1f}")
        out.append(cats)
        if peak.get("by_line"):
            lines = Table(title="Live at the peak, by the line that allocated it", title_justify="left", header_style="bold")
            lines.add_column("line")
            lines.add_column("MiB", justify="right")
            lines.add_column("code", style="dim")
            for row in peak["by_line"]:
                at = f"{row['file']}:{row['line']}" if row.get("line") else "(no line)"
                lines.add_row(at, f"{row['bytes'] / MIB:,.1f}", row.get("text") or "")
            out.append(lines)
    for note in result.get("notes") or []:
        out.append(Text(f"note: {note}", style="yellow"))
    return out


def _shapes(shapes) -> str:
    if not shapes:
        return ""
    return ", ".join(str(tuple(s)) if isinstance(s, list) else str(s) for s in shapes if s not in ([], None))


# What the chart stacks, bottom to top, with its label and colour.
_DRAWN = (
    ("parameters", "parameters", "#2e7d32"),
    ("gradients", "gradients", "#1565c0"),
    ("optimizer_state", "optimizer state", "#f9a825"),
    ("inputs", "inputs (and tensors made from them)", "#6d4c41"),
    ("kept", "kept past its step", "#00838f"),
    ("activations", "activations (kept for backward)", "#c62828"),
    ("autograd_detail", "autograd detail (made by backward)", "#ef6c00"),
    ("temporaries", "temporaries", "#8e24aa"),
    ("unknown", "unknown", "#9e9e9e"),
)


def _short(code: str | None, width: int = 60) -> str:
    code = code or ""
    return code if len(code) <= width else code[: width - 3] + "..."


def peak_window(result: dict) -> tuple[float, float] | None:
    """``(start, end)`` in ms of the step that holds the peak, when it is a small part of the run; else ``None``.

    A first step that loads kernels can take most of a run's time and squeeze
    the step that matters (the one that failed, or the highest) into a sliver.
    """
    timeline = result.get("timeline") or {}
    times = timeline.get("times_ms") or []
    peak = result.get("peak")
    if not times or not peak:
        return None
    ends = timeline.get("step_ends_ms") or []
    t = peak["time_ms"]
    start = max((e for e in ends if e < t), default=times[0])
    end = min((e for e in ends if e >= t), default=times[-1])
    failure = result.get("failure") or {}
    if failure.get("time_ms") is not None:
        end = max(end, failure["time_ms"])
    span = times[-1] - times[0]
    if span <= 0 or end - start > 0.5 * span:
        return None
    margin = 0.05 * (end - start)
    return start - margin, end + margin


def draw(result: dict, out_dir: Path) -> list[Path]:
    """``profile.png``: MiB by category over time, the peak marked with its operator and line.

    When the step that holds the peak is a small part of the run, a second
    panel shows that step alone.
    """
    timeline = result.get("timeline") or {}
    times = timeline.get("times_ms") or []
    if not times:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = timeline.get("bytes") or {}
    drawn = [(key, label, color) for key, label, color in _DRAWN if any(series.get(key) or [])]
    window = peak_window(result)
    if window:
        fig, (whole, zoom) = plt.subplots(2, 1, figsize=(13, 9), dpi=100, gridspec_kw={"height_ratios": [1, 1.6]})
        axes = (whole, zoom)
    else:
        fig, whole = plt.subplots(figsize=(13, 6), dpi=100)
        zoom, axes = None, (whole,)
    try:
        for ax in axes:
            ax.stackplot(
                times,
                *[[b / MIB for b in series[key]] for key, _, _ in drawn],
                labels=[label for _, label, _ in drawn],
                colors=[color for _, _, color in drawn],
                alpha=0.85,
                step="post",
            )
            _marks(ax, result, timeline)
            ax.set_ylabel("MiB")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        device = result.get("device", "")
        whole.set_title(f"Memory on {device} over time by category ({result.get('kind', '')})")
        if zoom is not None:
            whole.set_title(f"Memory on {device} over time by category ({result.get('kind', '')}): the whole run")
            whole.axvspan(*window, color="black", alpha=0.08, label="shown below")
            zoom.set_xlim(*window)
            which = "the failed step" if (result.get("peak") or {}).get("in_failed_step") else "the step with the peak"
            zoom.set_title(f"{which}, enlarged")
        _annotate_peak(axes[-1], result)
        axes[-1].set_xlabel("time since the first allocation (ms)")
        whole.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
        fig.tight_layout()
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "profile.png"
        fig.savefig(path)
    finally:
        plt.close(fig)
    return [path]


def _marks(ax, result: dict, timeline: dict) -> None:
    """Step ends, the budget, the failed request and the run's highest point."""
    for n, end in enumerate(timeline.get("step_ends_ms") or []):
        ax.axvline(end, color="black", alpha=0.35, linewidth=0.8, linestyle=":", label="optimizer step ends" if n == 0 else None)
    budget = result.get("budget_bytes")
    if budget:
        ax.axhline(budget / MIB, color="red", linestyle="--", linewidth=1.2, label=f"budget {budget / MIB:,.0f} MiB")
    failure = result.get("failure") or {}
    if failure.get("request_bytes"):
        # The request that failed never shows in the timeline: draw it on top of what was live.
        x, live = failure["time_ms"], failure["live_bytes"] / MIB
        ax.vlines(x, live, live + failure["request_bytes"] / MIB, color="red", linewidth=3, label="failed request")
        ax.plot([x], [live + failure["request_bytes"] / MIB], marker="x", color="red", markersize=10)
    peak = result.get("peak")
    run_peak = result.get("run_peak") or {}
    if peak and run_peak.get("total_bytes", 0) > peak["total_bytes"]:
        ax.plot([run_peak["time_ms"]], [run_peak["total_bytes"] / MIB], marker="v", color="grey", markersize=8, label="highest level of the run")
    if peak:
        ax.plot([peak["time_ms"]], [peak["total_bytes"] / MIB], marker="v", color="black", markersize=9, zorder=5)


def _annotate_peak(ax, result: dict) -> None:
    peak = result.get("peak")
    if not peak:
        return
    x, y = peak["time_ms"], peak["total_bytes"] / MIB
    label = "peak of the failed step" if peak.get("in_failed_step") else "peak"
    text = f"{label} {y:,.0f} MiB: {peak.get('op') or 'n/a'}"
    if peak.get("line"):
        text += f"\n{where(peak)}  {_short(peak.get('text'))}"
    culprit = peak.get("culprit") or {}
    if culprit.get("line") and culprit["line"] != peak.get("line"):
        text += f"\nmost of it from {culprit['file']}:{culprit['line']}  {_short(culprit.get('text'))}"
    parts = sorted((peak.get("by_category") or {}).items(), key=lambda kv: -kv[1])
    if parts:
        text += "\n" + ", ".join(f"{_label(c)} {b / MIB:,.0f}" for c, b in parts[:4] if b >= MIB) + " MiB"
    ax.annotate(
        text,
        xy=(x, y),
        xytext=(0.02, 0.97),
        textcoords="axes fraction",
        va="top",
        fontsize=10,
        bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9},
        arrowprops={"arrowstyle": "->", "color": "black"},
    )
