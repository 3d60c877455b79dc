"""What each allocation on the profiled device is: parameters, gradients, activations, temporaries, ...

Three sources name a tensor, tried in this order:

1. the profiler's memory model (``torch.profiler._memory_profiler``, a private
   API), which follows tensors through the operators and names parameters,
   gradients and optimizer state well; on CUDA it leaves most forward-pass
   tensors unnamed;
2. the tensor's lifetime (:func:`~oomlab.tools.profile.analysis.lifetime_category`):
   who made it (a forward pass, backward, the optimizer) and when it was freed;
3. in a step that failed, and so has no backward to tell by, the category that
   tensors from the same operator, line and size had in the completed steps.
"""

from __future__ import annotations

from oomlab.tools.profile.analysis import free_times, lifetime_category
from oomlab.tools.profile.events import BACKWARD_OP, Sites, is_op, phase
from oomlab.units import format_bytes

__all__ = ["categorize", "model_categories"]

# The memory model's category names, as the result spells them.
MODEL_NAMES = {
    "PARAMETER": "parameters",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "INPUT": "inputs",
    "AUTOGRAD_DETAIL": "autograd_detail",
}


def categorize(prof, events, dev_allocs, step_ends: list[int], failed: bool, sites: Sites, notes: list) -> tuple[list, dict]:
    """The category of every allocation on the device, and what the memory model did.

    ``dev_allocs`` are the device's :func:`~oomlab.tools.profile.events.allocation_events`.
    A free gets its allocation's category, or ``None`` (not drawn) when the
    memory was allocated before the profiler started; an allocation nothing
    could name is ``"unknown"``. The model's part says whether it was
    ``available``, its ``error``, and the ``bytes_categorized_by`` each source.
    """
    model: dict = {"available": False, "error": None}
    known = None
    try:
        known = model_categories(prof)
        model["available"] = True
    except Exception as err:
        model["error"] = f"{type(err).__name__}: {err}"
        notes.append(
            f"the profiler's memory model failed ({model['error']}): parameters, gradients and optimizer state are not told apart"
        )
    backward_starts = sorted(e.start_time_ns for e in events if is_op(e) and e.name.startswith(BACKWARD_OP))
    optimizer_calls = sorted((e.start_time_ns, e.end_time_ns) for e in events if is_op(e) and e.name.startswith("Optimizer."))
    freed_at = free_times([(a[0], a[1], a[2]) for a in dev_allocs])
    # The end of what was seen: the last allocation before the failure, or the last event.
    t_end = next((a[0] for a in reversed(dev_allocs) if a[1] > 0 or not failed), 0)
    categories: list = [None] * len(dev_allocs)
    by_source = dict.fromkeys(("memory_model", "lifetime", "earlier_steps", "unknown"), 0)
    learned: dict[tuple, str] = {}  # (op, file, line, size) of a forward tensor -> its category in a completed step
    live: dict[int, str] = {}
    for index, (t, size, ptr, _, _, event) in enumerate(dev_allocs):
        if size < 0:
            categories[index] = live.pop(ptr, None)  # None: allocated before the profiler started
            continue
        category = known(event.typed[1]) if known else None
        source = "memory_model"
        if category is None:
            made_in = phase(event, optimizer_calls)
            category = lifetime_category(made_in, t, freed_at.get(index), backward_starts, step_ends, t_end)
            source = "lifetime"
            if made_in == "forward":
                site = sites.of(event)
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
            f"the memory model named {format_bytes(by_source['memory_model'])} of the allocations; "
            f"{format_bytes(by_source['lifetime'])} were named by when they lived "
            "(forward to backward: activations; freed before backward: temporaries; "
            "made by backward: autograd detail; made by the optimizer and kept: optimizer state; "
            "made in forward or backward and still live after the step: kept)"
            + (
                f", {format_bytes(by_source['earlier_steps'])} of the failed step as in the steps before it"
                if by_source["earlier_steps"]
                else ""
            )
        )
    return categories, model


def model_categories(prof):
    """A lookup from an allocation's fields to the memory model's category name, or ``None`` when it has none.

    Raises when the private API is missing. A tensor whose category changes
    between versions keeps the category of its earliest version that has one.
    """
    from torch.profiler import _memory_profiler as mp

    snapshot = mp.MemoryProfile(prof.profiler.kineto_results)._category_snapshot()
    by_key: dict = {}
    for (key, _version), category in sorted(snapshot.items(), key=lambda kv: kv[0][1]):
        if category is not None and key not in by_key:
            by_key[key] = MODEL_NAMES.get(category.name)

    def lookup(fields):
        key = mp.TensorKey.from_allocation(fields)
        return by_key.get(key) if key is not None else None

    return lookup
