"""Reading the live profiler: its event tree as plain facts, and its operator table.

``prof.profiler.kineto_results.experimental_event_tree()`` (a private API)
gives every event of the run as a tree: operators (``TorchOp``), allocations
and frees (``Allocation``, with the pointer, size, device and the allocator's
total), and Python calls (``PyCall``, ``PyCCall``) with the code location that
made them. An allocation's parents say which operator made it and which
Python lines called that operator, so each allocation can be traced to the
learner's line.

The functions here turn that tree into the tuples and dicts that
:mod:`~oomlab.tools.profile.analysis` reasons about. They need the profiler's
objects, so they run in the probe, behind its guards.
"""

from __future__ import annotations

import bisect
import linecache
import os
import sys

from oomlab.frames import is_library, is_script
from oomlab.tools.profile.analysis import Calls, choose_culprit, covering_call, live_allocations

__all__ = [
    "BACKWARD_OP",
    "TOP_OPS",
    "Sites",
    "allocation_events",
    "event_type",
    "forward_passes",
    "is_op",
    "peak_site",
    "phase",
    "profiled_device",
    "top_ops",
    "walk",
]

TOP_OPS = 10
BACKWARD_OP = "autograd::engine::evaluate_function"  # the operator an autograd node runs in, during backward


def walk(roots):
    """Every event of the profiler's event tree, parents before children (iterative: deep trees)."""
    stack = list(reversed(roots or []))
    while stack:
        event = stack.pop()
        yield event
        stack.extend(reversed(event.children))


def event_type(event) -> str:
    """``"TorchOp"``, ``"Allocation"``, ``"PyCall"``, ...: the kind of an event, whatever the enum's spelling."""
    return event.typed[0].name if hasattr(event.typed[0], "name") else str(event.typed[0]).rsplit(".", 1)[-1]


def is_op(event) -> bool:
    return event_type(event) == "TorchOp"


def allocation_events(events) -> list[tuple]:
    """``(t_ns, signed bytes, ptr, device, allocator total, event)`` for every allocation and free, in time order."""
    out = []
    for event in events:
        if event_type(event) != "Allocation":
            continue
        fields = event.typed[1]
        out.append(
            (event.start_time_ns, int(fields.alloc_size), int(fields.ptr), str(fields.device), int(fields.total_allocated), event)
        )
    out.sort(key=lambda a: a[0])
    return out


def profiled_device(allocations) -> str:
    """The GPU when the run allocated on one (the budget is there), else the CPU."""
    for device in sorted({a[3] for a in allocations}):
        if device.startswith("cuda"):
            return device
    return "cpu"


def phase(event, optimizer_calls: list[tuple[int, int]]) -> str:
    """Who made an allocation: ``"backward"`` (an autograd node), ``"optimizer"`` (an optimizer call) or ``"forward"``.

    Optimizer calls are found by time: their ``record_function`` ranges are
    not always ancestors of the allocations made inside them.
    """
    node = event.parent
    while node is not None:
        if is_op(node) and node.name.startswith(BACKWARD_OP):
            return "backward"
        node = node.parent
    t = event.start_time_ns
    k = bisect.bisect_right(optimizer_calls, (t, float("inf"))) - 1
    if k >= 0 and optimizer_calls[k][1] >= t:
        return "optimizer"
    return "forward"


def forward_passes(events) -> list[tuple[int, int]]:
    """``(start, end)`` of every outermost ``nn.Module`` call (a model's forward pass), in time order."""
    passes = []
    for event in events:
        if event_type(event) != "PyCall" or getattr(event.typed[1], "module", None) is None:
            continue
        node, nested = event.parent, False
        while node is not None and not nested:
            nested = event_type(node) == "PyCall" and getattr(node.typed[1], "module", None) is not None
            node = node.parent
        if not nested:
            passes.append((event.start_time_ns, event.end_time_ns))
    passes.sort()
    return passes


def top_ops(prof, device: str, notes: list) -> tuple[list[dict], str]:
    """The operators that allocated the most, grouped by the operator the program called; and what was counted.

    ``key_averages()`` credits every byte to ``aten::empty`` or
    ``aten::empty_strided`` (the ops that call the allocator), which names no
    culprit. So each allocation is credited to the outermost ``aten::`` op
    around it: the one the learner's code, autograd or the optimizer called
    (``aten::one_hot``, ``aten::to``, ``aten::mm``). Its bytes are the net
    bytes allocated during the call, the ops it called included: its outputs.
    """
    metric = "net bytes allocated by the call (its outputs), ops it called included"
    # Newer torch says "device", older "cuda"; CPU bytes have one name throughout.
    counters = ("device_memory_usage", "cuda_memory_usage") if device.startswith("cuda") else ("cpu_memory_usage",)
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
        nbytes = next((int(v) for v in (getattr(event, c, None) for c in counters) if v is not None), 0)
        row = table.setdefault(name, {"op": name, "calls": 0, "bytes": 0, "largest_call_bytes": 0, "input_shapes": None})
        row["calls"] += 1
        if nbytes > 0:
            row["bytes"] += nbytes
            if nbytes > row["largest_call_bytes"]:
                row["largest_call_bytes"] = nbytes
                shapes = event.input_shapes or []
                row["input_shapes"] = [list(s) if isinstance(s, (list, tuple)) else s for s in shapes]
    rows = sorted((r for r in table.values() if r["bytes"] > 0), key=lambda r: -r["bytes"])
    return rows[:TOP_OPS], metric


class Sites:
    """Where an allocation comes from: its operator, and the learner's line that called it.

    The line is the innermost frame of the user's code on the allocation's
    Python stack (the script, or a file of the user's that it imports, such as
    a model file beside it), with the script's own line that called into it
    as ``caller`` where the two differ. Allocations made on autograd's device
    thread have no Python frames above them; the user call that covers them in
    time (``loss.backward()``) names the line instead, so the Python calls of
    the whole run are kept, sorted for that lookup. Frames are cached: a run
    makes thousands of allocations from a few hundred code locations.
    """

    def __init__(self, events, script: str):
        self.script = script
        self._frames: dict = {}
        calls = []
        for event in events:
            if event_type(event) in ("PyCall", "PyCCall"):
                frame = self.frame(event.typed[1].caller)
                if frame["user"]:
                    calls.append((event.start_time_ns, event.end_time_ns, frame))
        self.calls = Calls(calls)

    def of(self, event) -> dict:
        """Operator, context and source line of one allocation event, and how the line was found."""
        op, context, frames = None, None, []
        node = event.parent
        while node is not None:
            kind = event_type(node)
            if kind == "TorchOp":
                if node.name.startswith("aten::") and not frames and context is None:
                    op = node.name  # the outermost aten:: op of the innermost run of ops
                elif context is None and not node.name.startswith("aten::"):
                    # "autograd::engine::evaluate_function: MulBackward0", "Optimizer.step#AdamW.step"
                    context = node.name
            elif kind in ("PyCall", "PyCCall"):
                frames.append(self.frame(node.typed[1].caller))
            node = node.parent
        # The innermost line of the user's code, a model file beside the script included, and the script's line
        # that called into it: the line that allocated, and the line that the learner runs.
        chosen = next((f for f in frames if f["user"]), None)
        caller = next((f for f in frames if f["script"]), None)
        via = "stack" if chosen else None
        if chosen is None:
            chosen = covering_call(self.calls, event.start_time_ns)
            via = "time" if chosen else None
        site = {"op": op, "context": context, "site_via": via, "file": None, "line": None, "function": None, "text": ""}
        if chosen:
            site.update(file=chosen["file"], line=chosen["line"], function=chosen["function"], text=chosen["text"])
        if chosen and caller and caller is not chosen:
            site["caller"] = {k: caller[k] for k in ("file", "line", "function", "text")}
        site["stack"] = [f"{f['file']}:{f['line']} in {f['function']}" for f in frames[:8]]
        return site

    def frame(self, location) -> dict:
        """A profiler code location as ``file``/``line``/``function``/``text``, and whether it is the learner's code.

        The profiler shortens file names relative to ``sys.path`` (``train.py``,
        ``torch/nn/modules/linear.py``), so the full path is found again through
        ``sys.path`` and the script's folder before reading the line. The
        script's frames are named by its base name, as the learner knows it.
        """
        name = _read(location, "file_name", "?")
        line = _read(location, "line_number", 0)
        function = _read(location, "function_name", "?")
        key = (name, line, function)
        if key not in self._frames:
            path = _resolve(name, self.script)
            in_script = is_script(path, self.script)
            user = in_script or not is_library(path or name)
            self._frames[key] = {
                "file": os.path.basename(name) if in_script else (user and _beside(path, self.script)) or name,
                "path": path,
                "line": line,
                "function": function,
                "text": linecache.getline(path, line).strip() if path else "",
                "script": in_script,
                "user": user,
            }
        return self._frames[key]


def peak_site(dev_allocs, t_peak: int, sites: Sites) -> tuple[dict, dict[int, int]]:
    """The allocation that made the peak, its operator and the learner's line, bytes live at the peak by line.

    Also ``{index: bytes}`` of the allocations live at the peak, for the
    question whether earlier forward passes left them.
    """
    nothing = {"op": None, "file": None, "line": None, "text": "", "site_via": None, "culprit": None}
    times = [a[0] for a in dev_allocs]
    candidates = [a for a in dev_allocs[: bisect.bisect_right(times, t_peak)] if a[1] > 0]
    if not candidates:
        return nothing, {}
    last_t = candidates[-1][0]
    alloc = max((a for a in candidates if a[0] == last_t), key=lambda a: a[1])
    site = sites.of(alloc[5])
    site["allocation_bytes"] = alloc[1]
    site["allocator_total_bytes"] = alloc[4]

    # Which lines the bytes live at the peak came from: the line to change, and what it costs.
    live = live_allocations([(a[0], a[1], a[2]) for a in dev_allocs], t_peak)
    by_line: dict[tuple, int] = {}
    ops: dict[tuple, dict[str, int]] = {}  # the operators that made each line's bytes: the advice depends on them
    for index, size in live.items():
        origin = sites.of(dev_allocs[index][5])
        key = (origin["file"], origin["line"], origin["text"])
        by_line[key] = by_line.get(key, 0) + size
        made = ops.setdefault(key, {})
        made[origin["op"]] = made.get(origin["op"], 0) + size
    ranked = sorted(by_line.items(), key=lambda kv: -kv[1])
    site["by_line"] = [
        {"file": f, "line": n, "text": text, "bytes": b, "op": max(ops[f, n, text], key=ops[f, n, text].get)}
        for (f, n, text), b in ranked[:8]
    ]
    site["line_bytes"] = by_line.get((site["file"], site["line"], site["text"]), 0) if site["line"] else 0
    site["culprit"] = choose_culprit(site, site["by_line"])
    return site, live


def _read(location, attribute: str, default):
    """One field of a profiler code location; some torch builds return undecodable names."""
    try:
        return getattr(location, attribute)
    except (UnicodeDecodeError, AttributeError, RuntimeError):
        return default


def _beside(path: str | None, script: str) -> str | None:
    """``path`` relative to the script's folder when it lies there (``model.py`` beside ``train.py``), else None."""
    if not path or not script:
        return None
    folder = os.path.dirname(os.path.abspath(script))
    path = os.path.abspath(path)
    return os.path.relpath(path, folder) if path.startswith(folder + os.sep) else None


def _resolve(name: str, script: str) -> str | None:
    """The absolute path of a file name as the profiler gives it, or ``None`` when no such file is found."""
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
