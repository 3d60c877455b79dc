"""The hunt's verdict: from the walk's holders to one finding, its culprit, and what to do.

The walk's holders (:func:`~oomlab.tools.hunt.holders.find_holders`) say which
root holds which bytes; they cannot say which of them should not be there. A model, its optimizer state
and the current step's tensors are supposed to be on the device. Memory that
outlives its step shows one of these signs, and the largest holder that shows
one is the culprit:

- ``cycle``: only a reference cycle keeps it (the garbage collector would free it);
- ``graph-leak``: most of what it holds was saved by autograd graphs, and it is
  not just this step's forward pass (a container of graphs, several graphs, or
  a graph that grew across steps);
- ``container-leak``: it grew by at least ``min_bytes`` since the baseline
  optimizer step, it holds at least ``min_bytes`` of tensors that an earlier
  step's forward pass made (their ``grad_fn`` is older than the last optimizer
  step), or it is kept by an exception's traceback.

Growth counts only what the step in progress did not make: what autograd
nodes made since the last optimizer step saved (``step_graph_bytes``) is that
step's forward pass, expected to be alive until its backward. And the graph in
flight (the forward or backward pass that was running when the script
stopped, see :mod:`~oomlab.tools.hunt.inflight`) is a holder of its own,
labelled ``in flight``: reported with its size, never a culprit, so a holder
that grew across steps is the one blamed.

With no sign, a large holder of several tensors that is not model state is
reported as ``held`` (maybe meant, maybe not); else the finding is ``none``.
``error`` is the probe's failure (see :func:`oomlab.tools.base.error_result`).

Pure over plain data, standard library only: the tests drive it with
synthetic holders, and the probe runs it inside the measured process.
"""

from __future__ import annotations

import re

from oomlab.steps import advice as structural_advice
from oomlab.tools.hunt.holders import CYCLE
from oomlab.tools.hunt.inflight import IN_FLIGHT
from oomlab.tools.hunt.roots import CONTEXT_ROOT
from oomlab.tools.hunt.state import STATE
from oomlab.units import MIB, format_bytes

__all__ = [
    "ADVICE",
    "IN_FLIGHT",
    "TOOL",
    "TOP_HOLDERS",
    "advice",
    "describe",
    "headline",
    "own_bytes",
    "stable_name",
    "summarize",
]

TOOL = "hunt"
TOP_HOLDERS = 20
# How a root's type reads where Python's own name for it says little.
TYPE_NAMES = {"_lru_cache_wrapper": "functools.lru_cache"}

# The hunt's own findings; the structural ones (graph-leak, container-leak, cycle) are the workflow's, in oomlab.steps.
ADVICE = {
    "traceback": (
        "An exception keeps its traceback, and the traceback keeps every frame it passed through with all "
        "their local variables: the failed batch, its activations, its graph. Keep str(err) instead of the "
        "exception, and retry after the except block has ended, not inside it."
    ),
    "held": (
        "This holder is the largest thing on the device besides the model, but nothing shows it growing "
        "from one optimizer step to the next: it may be what the script means to keep. If memory still "
        "runs out, compare allocated with reserved memory: the gap is the allocator's cache, not any "
        "object (fragmentation)."
    ),
    "none": (
        "No Python object keeps device memory from one step to the next: it is the model, its optimizer "
        "state and the current step's tensors. Profile the step to find its peak instead."
    ),
    "error": "The hunt itself failed; the error above says why.",
}


def advice(kind: str) -> str:
    """What to do about a finding of ``kind``: the workflow's advice for a structural one, else the hunt's own."""
    return structural_advice(kind) or ADVICE.get(kind, "")


def stable_name(name: str) -> str:
    """A root's name without its line number, to match the same local at two moments."""
    return re.sub(r" \([^()]*:\d+\)$", "", name)


def own_bytes(h: dict) -> int:
    """What a holder holds besides model/optimizer state: the bytes that can be its fault."""
    return h["bytes"] - h["state_bytes"]


def describe(name: str, type_name: str = "") -> str:
    """A root's name as a reader says it.

    ``"evaluate() local 'losses' (train.py:40)"`` of type ``list`` becomes
    ``list `losses` (local of evaluate() at train.py:40)``.
    """
    kind = "tensor" if type_name in ("Tensor", "Parameter") else TYPE_NAMES.get(type_name, type_name)
    match = re.fullmatch(r"(.+?) local '(.+)' \((.+)\)", name)
    if match:
        func, var, where = match.groups()
        return f"{kind} `{var}` (local of {func} at {where})".strip()
    match = re.fullmatch(r"global '(.+)'( \((.+)\))?", name)
    if match:
        var, _, where = match.groups()
        return f"{kind} `{var}` (global{' in ' + where if where else ''})".strip()
    match = re.fullmatch(r"class attribute '(.+)'", name)
    if match:
        return f"{kind} `{match.group(1)}` (class attribute)".strip()
    if name == CONTEXT_ROOT:
        return f"the {kind} being handled when the script failed (its traceback keeps that attempt's frames)"
    return name if kind in ("", "cycle", "graph") else f"{kind} {name}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _via_traceback(h: dict) -> bool:
    """Whether the holder's largest tensor is kept by an exception's traceback (a frame it passed through)."""
    return ".__traceback__" in h.get("largest_path", "")


def _leak_sign(h: dict, min_bytes: int) -> str | None:
    """Why this holder looks like memory kept beyond its step, or ``None``."""
    if h["label"] == CYCLE:
        return "cycle"
    kept = h.get("surviving") or _via_traceback(h)
    # A bare tensor with one graph is the current step's forward pass; kept in a container, or
    # several graphs at once, or a graph that grew across steps, is a forward pass nobody will backward.
    mostly_graph = h["graph_bytes"] > h["direct_bytes"] and h["graph_bytes"] >= min_bytes
    if mostly_graph and (not h["tensor_root"] or h["graphs"] >= 2 or kept):
        return "graph-leak"
    if kept:
        return "container-leak"
    return None


def _blamed_bytes(h: dict) -> int:
    """What a culprit is blamed for: its own bytes, or, blamed for state it gained, that gain."""
    return h["state_grew_bytes"] if h.get("state_grown") else own_bytes(h)


def summarize(
    holders: list[dict],
    *,
    allocated: int | None = None,
    reserved: int | None = None,
    steps: list[int] | None = None,
    baseline: dict | None = None,
    baseline_step: int | None = 1,
    baseline_named_all: bool = True,
    state_baseline: dict | None = None,
    in_flight: set = frozenset(),
    unexplained: list | tuple = (),
    min_bytes: int = MIB,
) -> dict:
    """Turn the walk's holders into ``hunt.json``: a kind, a headline and the culprit's bytes.

    ``baseline`` maps a root's name without its line (see :func:`stable_name`)
    to the non-state bytes it held after optimizer step ``baseline_step``; a
    holder that holds ``min_bytes`` more now, besides what this step's graphs
    saved, is "surviving across steps". A name only the back search finds is
    absent from a baseline where it held nothing, provided that baseline's
    back search named everything it met (``baseline_named_all``); otherwise
    its growth is unknown. ``state_baseline`` maps the same names to the
    model/optimizer state each held then: state that grew by ``min_bytes``
    since is a leak too (a buffer or an optimizer entry added every step),
    though state is otherwise never a culprit. Holders named in ``in_flight`` are the
    call that was running: never culprits, and no more is the graph in flight.
    ``unexplained`` is what the back search could not name
    (``[{owner, bytes, storages}]``), kept for the report.
    """
    holders = [dict(h) for h in holders]
    for h in holders:
        h["what"] = describe(h["name"], h["type"])
        # A name only the back search finds is absent from a baseline where it held nothing yet.
        absent = 0 if h.get("back_searched") and baseline_named_all else None
        before = None if baseline is None else baseline.get(stable_name(h["name"]), absent)
        h["baseline_bytes"] = before
        h["grew_bytes"] = None if before is None else own_bytes(h) - h.get("step_graph_bytes", 0) - before
        grew = h["grew_bytes"] is not None and h["grew_bytes"] >= min_bytes
        # Made by an earlier step's forward and still alive: kept across steps even where no baseline shows it grow
        # (the run died before a second optimizer step, or the baseline already held it).
        h["earlier"] = not grew and h.get("earlier_step_bytes", 0) >= min_bytes
        h["surviving"] = grew or h["earlier"]
        before_state = None if state_baseline is None else state_baseline.get(stable_name(h["name"]))
        h["state_grew_bytes"] = None if before_state is None else h["state_bytes"] - before_state
        if h["name"] in in_flight and not h["label"]:
            h["label"] = IN_FLIGHT
    candidates = [h for h in holders if h["label"] not in (IN_FLIGHT, STATE) and own_bytes(h) >= min_bytes]
    signed = [(h, _leak_sign(h, min_bytes)) for h in candidates]
    signed = [(h, sign) for h, sign in signed if sign]
    # State that gained tensors since the baseline step: not the work itself, whoever holds it. A name bound to one
    # tensor gains none: what it holds changed because the name was bound to another parameter (a loop's `p`, left
    # on the first weight by a failure in the loop, on the last bias after a loop that ended).
    for h in holders:
        grew = (h["state_grew_bytes"] or 0) >= min_bytes and not h["tensor_root"]
        if h["label"] != IN_FLIGHT and grew and all(h is not s for s, _ in signed):
            h["state_grown"] = True
            signed.append((h, "container-leak"))
    own_total = sum(own_bytes(h) for h in holders if h["label"] != IN_FLIGHT)
    culprit, kind = None, "none"
    if signed:
        culprit, kind = max(signed, key=lambda pair: _blamed_bytes(pair[0]))
    else:
        kept = [h for h in candidates if not h["tensor_root"] and h["tensors"] + h["saved_tensors"] >= 2]
        kept = [h for h in kept if own_bytes(h) >= 0.25 * own_total]
        if kept:
            culprit, kind = max(kept, key=own_bytes), "held"
    if culprit is not None:
        culprit["label"] = "culprit" if culprit["label"] != CYCLE else "culprit (cycle)"

    state = sum(h["state_bytes"] for h in holders)
    in_flight_bytes = sum(own_bytes(h) for h in holders if h["label"] == IN_FLIGHT)
    return {
        "tool": TOOL,
        "kind": kind,
        "headline": headline(
            kind,
            culprit,
            allocated=allocated,
            baseline_step=baseline_step,
            has_baseline=baseline is not None,
            state=state,
            current=own_total,
            in_flight=in_flight_bytes,
        ),
        "culprit_bytes": _blamed_bytes(culprit) if culprit else 0,
        "culprit": culprit["name"] if culprit else None,
        "culprit_path": culprit["largest_path"] if culprit else None,
        "advice": ADVICE["traceback"] if culprit and _via_traceback(culprit) else advice(kind),
        "holders": holders[:TOP_HOLDERS],
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "explained_bytes": sum(h["bytes"] for h in holders),
        "state_bytes": state,
        "in_flight_bytes": in_flight_bytes,
        "unexplained": list(unexplained),
        "unexplained_bytes": sum(row["bytes"] for row in unexplained),
        "steps": list(steps or []),
        "baseline_step": baseline_step if baseline is not None else None,
    }


def headline(
    kind: str,
    h: dict | None,
    *,
    allocated: int | None,
    baseline_step: int | None,
    has_baseline: bool,
    state: int,
    current: int,
    in_flight: int = 0,
) -> str:
    """One sentence for finding ``kind`` about culprit ``h``: who holds how much, and the sign that gave it away.

    ``state``, ``current`` and ``in_flight`` (model/optimizer state, everything
    else the script holds, and what the call in progress holds) are what a
    ``none`` finding accounts the memory to.
    """
    share = ""
    if h and allocated:
        share = f" ({100 * _blamed_bytes(h) / allocated:.0f}% of the {format_bytes(allocated)} allocated)"
    if kind == "graph-leak":
        graphs = "autograd graph keeps" if h["graphs"] == 1 else "autograd graphs keep"
        if h["tensors"]:
            held = f"holds {_plural(h['tensors'], 'tensor')} whose {graphs}"
        else:
            held = f"holds {_plural(h['graphs'], 'autograd graph')} that keep"
        return f"{h['what']} {held} {format_bytes(h['graph_bytes'])} of saved activations{share}"
    tensors = _plural(h["tensors"] + h["saved_tensors"], "tensor") if h else ""
    if kind == "container-leak" and _via_traceback(h) and not h.get("surviving"):
        return (
            f"{h['what']} keeps {tensors}, {format_bytes(own_bytes(h))}, "
            f"alive through an exception's traceback ({h['largest_path']}){share}"
        )
    if kind == "container-leak" and h.get("state_grown"):
        return (
            f"{h['what']} holds {format_bytes(h['state_bytes'])} of model/optimizer state, "
            f"{format_bytes(h['state_grew_bytes'])} more than after optimizer step {baseline_step}: state that gains "
            f"tensors every step is a leak (unless parameters first got gradients since: layers unfrozen, "
            f"experts first routed){share}"
        )
    if kind == "container-leak" and h.get("earlier"):
        return (
            f"{h['what']} holds {tensors}, {format_bytes(own_bytes(h))}, of which "
            f"{format_bytes(h['earlier_step_bytes'])} an earlier step's forward pass made: "
            f"kept across steps{share}"
        )
    if kind == "container-leak":
        return (
            f"{h['what']} holds {tensors}, {format_bytes(own_bytes(h))}, "
            f"and grew by {format_bytes(h['grew_bytes'])} since optimizer step {baseline_step}{share}"
        )
    if kind == "cycle":
        verb = "is" if h["tensors"] + h["saved_tensors"] == 1 else "are"
        return f"{tensors} {verb} held only by a {h['name']}: gc.collect() frees {format_bytes(own_bytes(h))}{share}"
    if kind == "held":
        why = (
            "it did not grow across optimizer steps"
            if has_baseline
            else "no optimizer step had run, so growth across steps could not be checked"
        )
        return f"{h['what']} holds {tensors}, {format_bytes(own_bytes(h))}{share}; {why}"
    of = f" of the {format_bytes(allocated)} allocated" if allocated else ""
    flight = f", and {format_bytes(in_flight)} is in flight in the call that was running" if in_flight else ""
    return (
        f"nothing outlives its step: {format_bytes(state)}{of} is model/optimizer state and "
        f"{format_bytes(current)} the current step's tensors{flight}"
    )
