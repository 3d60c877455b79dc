"""Who holds the device memory: the walk's passes, in order, and one row per holder.

:func:`find_holders` is the hunt's one entry to the walk. Given the roots
(:mod:`~oomlab.tools.hunt.roots`) and the ids of model state
(:mod:`~oomlab.tools.hunt.state`), it runs, each pass bounded on its own:

1. the walk (:mod:`~oomlab.tools.hunt.walk`) from the script's names, then
   from the library frames of the call that was running, so what a script
   name also holds is credited to that name;
2. the cycle pass: the objects only a reference cycle keeps alive, which the
   garbage collector would free, walked as one more holder;
3. the back search (:mod:`~oomlab.tools.hunt.backsearch`), which names the
   owners of the device storages no root reached and hands them back to the
   walk as roots of their own;
4. the graph in flight (:mod:`~oomlab.tools.hunt.inflight`), which takes what
   the failing forward or backward pass saved away from whichever name
   reached it first.

Then it tallies the walk's claims into one plain dict per holder (bytes held
directly, saved by graphs, saved by this step's graphs, model state) with the
path to its largest tensor, which is all the verdict
(:mod:`~oomlab.tools.hunt.analysis`) and ``hunt.json`` ever see.

Torch-free at import, like the walk.
"""

from __future__ import annotations

import collections
import gc
import sys
import types
import warnings

from oomlab.tools.hunt import backsearch, inflight
from oomlab.tools.hunt.paths import root_expr
from oomlab.tools.hunt.state import STATE
from oomlab.tools.hunt.walk import MAX_DEPTH, MAX_NODES, WEAK_PROXIES, Walk

__all__ = ["CYCLE", "find_holders"]

# The label of the holder that a reference cycle is, which the verdict reads.
CYCLE = "cycle"


def find_holders(
    roots: dict,
    *,
    device_type: str = "cuda",
    exclude: set = frozenset(),
    skip: set = frozenset(),
    cycles: bool = True,
    saved_hooks_hidden: bool = False,
    back_search: bool = True,
    since_sequence: int | None = None,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    report: dict | None = None,
    torch=None,
) -> list[dict]:
    """Attribute every ``device_type`` tensor storage reachable from ``roots`` to one root.

    Args:
        roots: ``{name: object}``, e.g. ``{"evaluate() local 'losses' (train.py:40)": losses}``.
            The walk starts from all of them at once, so a storage shared by two
            roots goes to the one that reaches it in fewer references (the
            earlier root on a tie): each storage is counted once. Names in
            ``roots.in_flight`` (a :class:`~oomlab.tools.hunt.roots.Roots`) are walked after all others.
        device_type: only storages on this device type count (``"cpu"`` in tests).
        exclude: ``id()`` of tensors that are model/optimizer state (see
            :func:`~oomlab.tools.hunt.state.model_state_ids`); their storages (and parameters' gradients,
            and any ``nn.Parameter``) count as ``state_bytes``, not as a culprit.
        skip: ``id()`` of objects never to enter.
        cycles: also ask the garbage collector which objects only a reference
            cycle keeps alive, and report what they hold as one more holder.
        saved_hooks_hidden: the script packed saved tensors with
            ``saved_tensors_hooks`` and this torch cannot tell which values they
            packed (no ``SavedTensor.unpack_hook``): read no saved value at all,
            since reading one would run the script's unpack hook.
        back_search: after the walk, search back from every live storage on
            the device that no root reached to an object that can be named
            (see :mod:`~oomlab.tools.hunt.backsearch`): a module global, a
            class attribute, an entry of an ``lru_cache``. What it explains is
            credited to that name; what it cannot, goes into ``report``.
        since_sequence: the autograd sequence number at the last optimizer
            step (:func:`~oomlab.tools.hunt.inflight.next_sequence_nr`), or
            None. It tells the graph in flight (made by the step in progress)
            from graphs kept since earlier steps; see
            :mod:`~oomlab.tools.hunt.inflight`.
        report: if given, filled with what the walk itself saw (nodes,
            truncated, unreadable saved tensors, ``in_flight``: the phase of
            the graph in flight or ""), and with the back search's figures
            (``back_search``) and what it left unexplained (``unexplained``,
            ``[{owner, bytes, storages}]``).
        torch: the module that tells tensors apart; by default the one this
            process imported. Without one no tensor exists, and nothing is held.

    Returns:
        One dict per root (and per cycle) that holds any such storage, largest
        ``bytes`` first, with ``name``, ``type``, ``bytes`` (all it holds),
        ``state_bytes``, ``direct_bytes`` (plain references), ``graph_bytes``
        (saved by autograd graphs), ``tensors`` and ``saved_tensors`` (storages
        behind those), ``graphs`` (graphs that keep saved tensors),
        ``step_graph_bytes`` (what of ``graph_bytes`` nodes made since
        ``since_sequence`` saved), ``earlier_step_bytes`` (what of ``direct_bytes``
        is tensors that nodes made before ``since_sequence``: an earlier step's
        outputs, still alive), ``largest_path`` and ``largest_bytes``,
        ``tensor_root``, ``back_searched`` (a root only the back search
        found) and ``label``. The graph in flight, when the failing
        call's frames hold one, is a holder of its own labelled
        :data:`~oomlab.tools.hunt.inflight.IN_FLIGHT`.
    """
    torch = torch or sys.modules.get("torch")
    if torch is None:
        return []
    walk = Walk(torch, device_type, exclude, skip, max_depth, max_nodes, saved_hooks_hidden)
    names = list(roots)
    for name in names:
        walk.add_root(name, roots[name])
    found = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading attributes must not print into the learner's output
        # The call in progress (library frames) goes last, so what a script name also holds is credited to it.
        in_flight = getattr(roots, "in_flight", set())
        for wave in (False, True):
            for index, name in enumerate(names):
                if (name in in_flight) == wave:
                    walk.push(roots[name], None, root_expr(name), index, 0, None)
            walk.run()
        if cycles and not walk.truncated:
            _walk_cycles(walk)
        if back_search and not walk.truncated:
            found = backsearch.search_back(walk, ignore={id(roots), id(getattr(exclude, "keep", None)), *skip})
        phase = inflight.split(walk, {n: roots[n] for n in names if n in in_flight}, since_sequence)
        holders = _aggregate(walk, since_sequence)
    if report is not None:
        report.update(
            nodes=len(walk.seen),
            truncated=walk.truncated,
            depth_limited=walk.depth_limited,
            unreadable_saved=walk.unreadable_saved,
            packed_saved=walk.packed_saved,
            in_flight=phase,
        )
        if found is not None:
            report.update(back_search=found.stats, unexplained=found.unexplained)
    return holders


def _walk_cycles(walk: Walk) -> None:
    """Credit what only reference cycles keep alive to one more holder, the cycle."""
    garbage = [o for o in _collect_cyclic_garbage() if type(o) not in WEAK_PROXIES]  # they hold nothing
    if not garbage:
        return
    index = walk.add_root(_cycle_name(garbage, walk.torch), None, kind="cycle", label=CYCLE)
    walk.only = {id(o) for o in garbage}
    # Start from the objects that hold things, then the dicts and tensors nothing in the
    # cycle led to: a tensor is then named by the attribute that holds it.
    for wave in (lambda o: not isinstance(o, (walk.torch.Tensor, dict)), lambda o: isinstance(o, dict), None):
        for obj in garbage:
            if wave is None or wave(obj):
                walk.push(obj, None, f"<{type(obj).__name__} in cycle>", index, 0, None)
        walk.run()
    walk.only = None


def _collect_cyclic_garbage() -> list:
    """The objects the garbage collector would free now, without freeing them.

    ``DEBUG_SAVEALL`` makes a collection append what it found to ``gc.garbage``
    instead of freeing it; we take those objects back out, so once our list is
    dropped they are unreachable cyclic garbage again, exactly as before.
    """
    flags, before = gc.get_debug(), len(gc.garbage)
    try:
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        gc.collect()
        found = gc.garbage[before:]
        del gc.garbage[before:]
    finally:
        gc.set_debug(flags)
    return found


def _cycle_name(objects: list, torch) -> str:
    counts = collections.Counter(
        type(o).__name__
        for o in objects
        if not isinstance(o, (dict, list, tuple, set, types.CellType, types.FunctionType, torch.Tensor))
    ) or collections.Counter(type(o).__name__ for o in objects)
    parts = [f"{n} {name}" for name, n in counts.most_common(3)]
    return f"reference cycle ({', '.join(parts)})"


def _aggregate(walk: Walk, since: int | None) -> list[dict]:
    """One row per root from the walk's claims; ``since`` (a sequence number) tells this step's graphs from older ones."""
    rows = {}
    sequence_of: dict[int, int | None] = {}  # node id -> its sequence number, read once

    def sequence(node) -> int | None:
        if id(node) not in sequence_of:
            sequence_of[id(node)] = inflight.sequence_nr(node)
        return sequence_of[id(node)]

    for key, (root, tid, entry, nbytes) in walk.claims.items():
        row = rows.setdefault(
            root,
            {
                "bytes": 0,
                "state_bytes": 0,
                "direct_bytes": 0,
                "graph_bytes": 0,
                "tensors": 0,
                "saved_tensors": 0,
                "graph_ids": set(),
                "step_graph_bytes": 0,
                "earlier_step_bytes": 0,
                "own": [],  # (bytes, id) of each tensor that is not state, in the walk's order
                "largest_state": (0, None),
            },
        )
        row["bytes"] += nbytes
        if key in walk.state_keys:
            row["state_bytes"] += nbytes
            row["largest_state"] = max(row["largest_state"], (nbytes, tid), key=lambda x: x[0])
            continue
        if entry is None:
            row["direct_bytes"] += nbytes
            row["tensors"] += 1
            if since is not None:  # a tensor an earlier step's forward made: kept across steps, whatever the baseline says
                node = _grad_fn(walk.seen.get(tid))
                number = None if node is None else sequence(node)
                if number is not None and number < since:
                    row["earlier_step_bytes"] += nbytes
        else:
            row["graph_bytes"] += nbytes
            row["saved_tensors"] += 1
            row["graph_ids"].add(entry)
            node = walk.parent[tid][0]
            if since is not None and node is not None:
                number = sequence(walk.seen[node])
                if number is not None and number >= since:
                    row["step_graph_bytes"] += nbytes  # saved by a node this step made
        row["own"].append((nbytes, tid))
    holders = []
    for root, row in rows.items():
        # The first of the largest, in the walk's order; state only where the holder holds no byte of its own.
        largest = max(row["own"], key=lambda x: x[0], default=(0, None))
        largest_bytes, tid = largest if largest[0] else row["largest_state"]
        tid = _on_the_heaviest_branch(walk, row["own"], largest_bytes) or tid
        only_state = row["state_bytes"] == row["bytes"]
        holders.append(
            {
                "name": walk.names[root],
                "type": walk.root_types[root],
                "bytes": row["bytes"],
                "state_bytes": row["state_bytes"],
                "direct_bytes": row["direct_bytes"],
                "graph_bytes": row["graph_bytes"],
                "step_graph_bytes": row["step_graph_bytes"],
                "earlier_step_bytes": row["earlier_step_bytes"],
                "tensors": row["tensors"],
                "saved_tensors": row["saved_tensors"],
                "graphs": len(row["graph_ids"]),
                "largest_path": walk.path(tid) if tid is not None else "",
                "largest_bytes": largest_bytes,
                "tensor_root": root in walk.tensor_roots,
                "back_searched": root in walk.back_searched,
                "label": walk.labels.get(root) or (STATE if only_state else ""),
            }
        )
    holders.sort(key=lambda h: (-h["bytes"], h["name"]))
    return holders


def _grad_fn(tensor):
    """The autograd node that made ``tensor``, or None (a leaf, a detached value, a tensor made without grad).

    A tensor computed with grad carries the node that made it, and the node's sequence number says in
    which step: below the number at the last optimizer step, an earlier step's forward pass made it
    (logits appended to a list, say, whose graph backward has freed), and it has outlived that step.
    """
    try:
        return tensor.grad_fn
    except Exception:  # noqa: BLE001 - a tensor subclass whose attributes fail: nothing to tell
        return None


def _on_the_heaviest_branch(walk: Walk, own: list[tuple[int, int]], largest: int) -> int | None:
    """Of a holder's largest tensors (``(bytes, id)`` in ``own``), the one down the branch that holds the most.

    Leaked tensors are often the size of the step's own: a generator's
    ``window`` of batches beside the ``batch`` it yields, a list of logits beside
    this step's logits. The path shown is to a largest tensor, so where several
    are as large, it goes down the references that keep the most bytes, and
    shows the leak rather than the step. None when there is no tie to break.
    """
    tied = [tid for nbytes, tid in own if nbytes == largest]
    if len(tied) < 2:
        return None
    weight: dict[int, int] = {}
    for nbytes, tid in own:
        node = tid
        while node is not None:
            weight[node] = weight.get(node, 0) + nbytes
            node = walk.parent[node][0]

    def branch(tid: int) -> tuple:
        chain = []
        node = tid
        while node is not None:
            chain.append(weight[node])
            node = walk.parent[node][0]
        return tuple(reversed(chain))

    return max(tied, key=branch)  # the first of equals: the walk's own order
