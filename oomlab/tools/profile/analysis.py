"""The profile's reasoning over plain data: the timeline, the peak, its kind, its culprit and the headline.

The probe reads the profiler into plain tuples (see :mod:`~oomlab.tools.profile.events`):
allocations and frees as ``(t_ns, signed bytes, ptr, ...)`` in time order,
optimizer step ends, Python calls as ``(start, end, frame)``. Everything here
works on those, and on the JSON result, so the tests drive it with synthetic
input and no torch.

Standard library only: the probe runs it inside the measured process.
"""

from __future__ import annotations

import bisect

from oomlab.steps import advice as structural_advice
from oomlab.units import format_bytes

__all__ = [
    "CATEGORIES",
    "MAX_POINTS",
    "PERSISTENT",
    "PEAK_ADVICE",
    "TOOL",
    "Calls",
    "advice",
    "carried_bytes",
    "category_label",
    "choose_culprit",
    "classify",
    "coalesce",
    "covering_call",
    "downsample",
    "failure_point",
    "free_times",
    "headline",
    "level_after",
    "level_at",
    "lifetime_category",
    "live_allocations",
    "peak_index",
    "total_levels",
    "where",
]

TOOL = "profile"
MAX_POINTS = 2000  # points of the timeline kept in the JSON (see downsample)

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
# What cuts a transient peak depends on the operator that made the most of its bytes (the culprit line's): the
# workflow's advice names a fused loss, which is no help where the loss is fused already and the bytes are logits.
PEAK_ADVICE = (
    (
        ("aten::one_hot",),
        "The peak is a one-hot matrix of the targets: F.cross_entropy takes the class indices as they are, with no "
        "one-hot matrix.",
    ),
    (
        ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"),
        "The peak is the output of a matrix product, such as an output layer's logits over a large vocabulary: make "
        "fewer of them at once. Compute the loss over chunks of the positions and add the chunks up, or compute "
        "logits only where a loss or a prediction needs them (the last position, when generating).",
    ),
    (
        ("aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax"),
        "The peak is a softmax over a large matrix, such as attention scores: F.scaled_dot_product_attention can "
        "compute attention without keeping the score matrix; a loss can take the logits as they are "
        "(F.cross_entropy applies log-softmax itself).",
    ),
    (
        ("aten::cat", "aten::stack", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::copy_", "aten::repeat"),
        "The peak holds a copy of a large tensor beside the original: keep one of them (views instead of copies, "
        "a preallocated buffer filled in place, or the original released before the copy is made).",
    ),
)

# Memory that outlives a training step; the rest is created and freed within it.
PERSISTENT = ("parameters", "gradients", "optimizer_state")


# --------------------------------------------------------------------------- allocations


def lifetime_category(
    phase: str, t: int, freed: int | None, backward_starts: list[int], step_ends: list[int], t_end: int
) -> str | None:
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


def live_allocations(allocs, t: int) -> dict[int, int]:
    """``{index: bytes}`` of allocations live after time ``t``; ``allocs`` are ``(t, signed bytes, ptr)`` in time order.

    Frees are paired with allocations by :func:`free_times`; frees of memory
    allocated before the profiler started match nothing and are ignored.
    """
    freed = free_times(allocs)
    return {index: size for index, (when, size, _) in enumerate(allocs) if size > 0 and when <= t and freed.get(index, t + 1) > t}


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


# --------------------------------------------------------------------------- the learner's line


class Calls(list):
    """A list of ``(start, end, frame)`` sorted by start, with its starts kept for bisection."""

    def __init__(self, calls):
        super().__init__(sorted(calls, key=lambda c: c[0]))
        self.starts = [c[0] for c in self]


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


def choose_culprit(site: dict, by_line: list[dict]) -> dict | None:
    """The line to blame: the peak's own line, unless another line holds more than twice its bytes at the peak.

    The allocation that tips the peak can be small (a label tensor) while a
    list of kept tensors holds most of it; then that list's line is the culprit.
    """
    ranked = [row for row in by_line if row.get("line")]
    # The operator that made most of the line's bytes, not only the allocation that tipped the peak (a copy of it).
    same = next((row for row in ranked if (row["file"], row["line"]) == (site.get("file"), site.get("line"))), {})
    own = {
        "file": site.get("file"),
        "line": site.get("line"),
        "text": site.get("text", ""),
        "bytes": site.get("line_bytes", 0),
        "op": same.get("op") or site.get("op"),
    }
    if not ranked:
        return own if own["line"] else None
    top = ranked[0]
    if own["line"] and own["bytes"] * 2 >= top["bytes"]:
        return own
    return dict(top)


# --------------------------------------------------------------------------- the timeline and its peak


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
    """The live bytes of all categories together, point by point."""
    columns = [levels[c] for c in CATEGORIES if c in levels]
    return [sum(values) for values in zip(*columns, strict=True)]


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


def carried_bytes(
    forwards, live: dict[int, int], allocated_at: dict[int, int], window_start: int | None, t_peak: int
) -> int | None:
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


# --------------------------------------------------------------------------- words


def advice(result: dict) -> str | None:
    """What to do about the profile's finding: for a transient peak, advice that fits the operator that made it.

    The operator is the culprit line's (the line that holds the most of the peak), else the
    peak's own; where it is none of :data:`PEAK_ADVICE`'s, the workflow's advice for a transient
    peak. None for a finding that is not a structural problem.
    """
    kind = result.get("kind", "")
    if kind != "transient-peak":
        return structural_advice(kind)
    peak = result.get("peak") or {}
    op = (peak.get("culprit") or {}).get("op") or peak.get("op") or ""
    return next((said for ops, said in PEAK_ADVICE if op in ops), None) or structural_advice(kind)


def category_label(category: str) -> str:
    """A category as people write it: ``optimizer state``."""
    return category.replace("_", " ")


def where(peak: dict) -> str:
    """``file:line`` of the peak (or of any site with those fields); empty when no line was recorded."""
    return f"{peak['file']}:{peak['line']}" if peak and peak.get("line") else ""


def called_from(peak: dict) -> str:
    """``", called from train.py:40"`` where the peak's line is in a file the script imports; else empty."""
    caller = (peak or {}).get("caller")
    return f", called from {caller['file']}:{caller['line']}" if caller and caller.get("line") else ""


def headline(result: dict) -> str:
    """One sentence: the peak, its operator and the line to blame, with figures."""
    peak = result.get("peak")
    if not peak:
        return result.get("headline") or "no memory peak was recorded"
    op = peak.get("op") or peak.get("context") or "an unnamed operation"
    culprit = peak.get("culprit") or {}
    own = {"file": peak.get("file"), "line": peak.get("line")}
    sentence = f"the peak, {format_bytes(peak['total_bytes'])}, "
    if not peak.get("line"):
        sentence += f"comes from {op} (no source line was recorded)"
    elif culprit and (culprit["file"], culprit["line"]) != (own["file"], own["line"]):
        sentence += (
            f"is reached in {op} at {where(peak)}{called_from(peak)}, but {culprit['file']}:{culprit['line']} ({culprit['text']}) "
            f"allocated the most of it, {format_bytes(culprit['bytes'])}"
        )
    else:
        sentence += f"comes from {op} at {where(peak)}"
        if peak.get("text"):
            sentence += f" ({peak['text']})"
        sentence += called_from(peak)
        if culprit.get("bytes"):
            sentence += f": tensors allocated on that line hold {format_bytes(culprit['bytes'])} of it"
    by_category = peak.get("by_category") or {}
    if by_category:
        largest = max(by_category, key=by_category.get)
        if largest != "unknown":  # uncategorized bytes (common on CUDA, and in a step cut short) explain nothing
            sentence += f"; {category_label(largest)} are {format_bytes(by_category[largest])} of it"
    if unprofiled := result.get("unprofiled_failure"):
        failed = result.get("failed_at")
        at = f" at {failed['file']}:{failed['line']}" if failed else ""
        how = "ran out of memory" if result.get("oom") else "failed"
        return (
            f"in the {result.get('profiled_steps')} profiled optimizer steps {sentence}; the run {how}{at} "
            f"after {unprofiled['after_steps']} steps, which were not all profiled: --all-steps profiles every step "
            "(slow on long runs)"
        )
    if result.get("stopped_early"):
        sentence = f"in the {result.get('profiled_steps')} profiled optimizer steps {sentence}"
    if not result.get("oom"):
        return sentence

    failed = result.get("failed_at")
    failure = result.get("failure") or {}
    at = f" at {failed['file']}:{failed['line']}" if failed else ""
    asking = ""
    if failure.get("request_bytes"):
        asking = f" asking for {format_bytes(failure['request_bytes'])} more with {format_bytes(failure.get('live_bytes'))} live"
    sentence = f"the run ran out of memory{at}{asking}; in the failed step " + sentence
    budget = result.get("budget_bytes")
    if budget and failure.get("request_bytes") and failure.get("live_bytes", 0) + failure["request_bytes"] <= budget:
        sentence += (
            f"; live tensors plus the request fit in the {format_bytes(budget)} budget, "
            "so the rest was held by the allocator's cache or lost to fragmentation"
        )
    return sentence
