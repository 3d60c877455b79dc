"""The graph in flight: what the forward or backward pass that was running when the script stopped keeps alive.

An OOM strikes inside an operation. If that operation is part of a forward
pass, the activations that pass has saved so far are supposed to be alive; if
it is part of ``loss.backward()``, so is the graph being run (the nodes not yet
reached still hold what they saved). That memory belongs to the step in
progress: it is the step's own peak, not something kept from earlier steps,
and the hunt must report it as "in flight" rather than blame the name that
happens to refer to it (``loss``, whose graph looks as if it "grew" since the
last optimizer step, when backward had freed it).

Which graph is in flight: the nodes reachable from the tensors that the
library frames of the failing call hold (``torch.autograd.backward()``'s
``tensors``, ``Linear.forward()``'s ``input``), created since the last
optimizer step. Autograd numbers every node it creates, in order, per thread
(``Node._sequence_nr()``); the probe reads the next number after each
optimizer step (:func:`next_sequence_nr`), so a node numbered below it was
made by an earlier step. Such a node is no part of the step in progress: a
graph that reaches back into earlier steps (a running loss summed without
``.detach()``) keeps that part as a leak, and the hunt still says so.

After the walk, :func:`split` takes what that graph saved away from whichever
root reached it first (``loss``, say, whose backward was running) and makes
it a holder of its own, labelled :data:`IN_FLIGHT`, which the verdict
(:mod:`~oomlab.tools.hunt.analysis`) reports with its size and never blames.

Standard library only at import, like the walk: torch is handed in.
"""

from __future__ import annotations

import collections
import re

from oomlab.tools.hunt.walk import Walk

__all__ = [
    "BACKWARD",
    "FORWARD",
    "IN_FLIGHT",
    "IN_FLIGHT_GRAPH",
    "graph_nodes",
    "next_sequence_nr",
    "phase",
    "sequence_nr",
    "split",
]

BACKWARD = "backward pass"
FORWARD = "forward pass"
# The label of what was in flight when the script stopped (its library frames, and its graph), which the verdict
# reads; and the name of the holder that the graph becomes.
IN_FLIGHT = "in flight"
IN_FLIGHT_GRAPH = "the autograd graph of the {phase} in flight when the script stopped"

# The library frames of a backward call: Tensor.backward(), torch.autograd.backward() and grad(), and the
# engine's entry point. Their names as the walk's roots give them: "_engine_run_backward() local 't_outputs' (...)".
_BACKWARD_FRAME = re.compile(
    r"^(Tensor\.backward|_engine_run_backward)\(\) local |^(backward|grad)\(\) local '[^']*' \([^)]*autograd/"
)
MAX_GRAPH_NODES = 200_000  # nodes of the graph in flight to look at; a step's graph has far fewer


def phase(in_flight_names) -> str:
    """``BACKWARD`` when a frame of the failing call was autograd's backward, else ``FORWARD``."""
    return BACKWARD if any(_BACKWARD_FRAME.match(name) for name in in_flight_names) else FORWARD


def sequence_nr(node) -> int | None:
    """The number autograd gave ``node`` when it made it; None where this torch does not say."""
    try:
        return int(node._sequence_nr())
    except Exception:  # a torch without Node._sequence_nr, or a node that is not autograd's
        return None


def next_sequence_nr(torch) -> int | None:
    """The number autograd will give the next node made on this thread: every node made from now on has one at least as high.

    Makes one throwaway node from a CPU scalar (no device memory); None where
    grad mode cannot make one here (inference mode) or this torch does not number nodes.
    """
    try:
        with torch.enable_grad():
            node = (torch.zeros((), requires_grad=True) * 1).grad_fn
        number = sequence_nr(node)
        return None if number is None else number + 1
    except Exception:  # inference mode, or a torch that differs: the hunt then treats every node as the current step's
        return None


def graph_nodes(values, torch, since: int | None) -> list:
    """The autograd nodes behind ``values`` made since sequence number ``since`` (all of them when it is None).

    ``values`` are what the failing call's frames hold: tensors, or lists and
    tuples of them (one level down). The walk stops at a node older than
    ``since``: a node's inputs were made before it, so everything behind it is
    older too. Leaf accumulators (``AccumulateGrad``, numbered last of all)
    save nothing and are left out. The nodes are returned, not their ids, so
    the caller keeps them alive and their ids stay theirs.
    """
    starts = []
    for value in values:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        starts.extend(item.grad_fn for item in items if isinstance(item, torch.Tensor) and item.grad_fn is not None)
    found, seen = [], set()
    queue = collections.deque(starts)
    while queue and len(seen) < MAX_GRAPH_NODES:
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "AccumulateGrad":
            continue
        number = sequence_nr(node) if since is not None else None
        if number is not None and number < since:
            continue  # made by an earlier step: not in flight, and nor is anything behind it
        found.append(node)
        try:
            queue.extend(next_node for next_node, _ in node.next_functions or ())
        except Exception:  # a node that cannot list its inputs ends the walk there
            continue
    return found


# --------------------------------------------------------------------------- after the walk


def split(walk: Walk, frames: dict, since: int | None) -> str:
    """Move what the graph in flight saved to a holder of its own.

    Returns the phase of the graph in flight (forward or backward pass), or ""
    when the failing call's frames hold no graph made since ``since``.

    ``frames`` are the failing call's library frames' locals (``{root name: value}``); ``since`` the
    sequence number autograd had reached at the last optimizer step. Whichever
    root reached a saved tensor first, if the node that saved it is part of the
    graph in flight the bytes go to that graph: never to ``loss``, whose
    backward was running.
    """
    if not frames:
        return ""
    nodes = graph_nodes(frames.values(), walk.torch, since)
    node_ids = {id(node) for node in nodes}
    running = phase(frames)
    moved = [
        claim
        for key, claim in walk.claims.items()
        if claim[2] is not None and key not in walk.state_keys and walk.parent[claim[1]][0] in node_ids
    ]
    if not moved:
        return running if nodes else ""  # a graph in flight whose every saved tensor a name also holds
    index = walk.add_root(IN_FLIGHT_GRAPH.format(phase=running), None, kind="graph", label=IN_FLIGHT)
    for claim in moved:
        claim[0] = index
    del nodes
    return running
