"""The back search: name what keeps alive the device tensors that the walk from named roots did not reach.

The walk (:mod:`~oomlab.tools.hunt.walk`) goes forward from names a person
wrote, and some owners are out of its sight: a cache that Python keeps in C
(the entries of a ``functools.lru_cache`` are no attribute of its wrapper),
a registry inside a library module or class (the walk never enters modules),
an object it reached too deep to go on. Their tensors are alive all the same,
and the garbage collector knows every container that refers to them.

So the walk hands over its *targets*, the live tensors and storages on the
device whose storage no root reached, and the search goes backwards from all
of them at once: ``gc.get_referrers`` gives the objects that refer to them,
then the objects that refer to those, one level at a time, until a chain meets
an object that can be named (an *arrival*):

- an object the walk reached from a root: its path is known (``attention_bias``);
- a module's namespace (``helpers.table``) or a class (``weakref.finalize._registry``);
- failing those, a frame, by its function, line and local variable.

Each target is named by the shortest chain down from an arrival, in the walk's
notation (:mod:`~oomlab.tools.hunt.paths`): ``attention_bias (functools.lru_cache)[2048]``,
``weakref.finalize._registry[<finalize>].args[0]['0.weight']``. What no chain
explains is returned too, with the furthest owner the search saw, so that the
hunt can say plainly how much it could not name.

The search itself (:func:`search`) knows of the walk only the objects it
reached. :func:`search_back` is the pass that joins the two, run by
:func:`~oomlab.tools.hunt.holders.find_holders` after the walk: it gathers the
targets (:func:`unreached`), searches, and hands every target explained back to
the walk under the root its chain arrived at, new roots included, so the
walk claims its storage there and follows its autograd graph like any other.

The cost is bounded: one ``gc.get_referrers`` pass over the heap per level,
at most ``MAX_LEVELS`` levels, stopping early at ``MAX_NODES`` objects met or
``TIME_LIMIT_S`` seconds (:func:`unreached` adds one ``gc.get_objects()``
pass and takes at most ``MAX_TARGETS`` storages, largest first). With no
target, the usual case once every holder has a name, nothing runs at all.

Standard library only; torch is handed in.
"""

from __future__ import annotations

import collections
import functools
import gc
import os
import sys
import time
import types

from oomlab.tools.hunt.paths import frame_locals, func_name, key_label, place
from oomlab.tools.hunt.walk import Walk, storage_key, storage_object_key

__all__ = [
    "MAX_LEVELS",
    "MAX_NODES",
    "MAX_TARGETS",
    "TIME_LIMIT_S",
    "Arrival",
    "Report",
    "Search",
    "search",
    "search_back",
    "unreached",
]

MAX_LEVELS = 24  # references back from a target; a logger's buffer is about 14 from the logging module
MAX_NODES = 100_000
MAX_TARGETS = 20_000
TIME_LIMIT_S = 20.0

# The measuring harness and the hunt itself: their frames hold what they are working on, never the learner's state.
_OOMLAB = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LRU_CACHE = getattr(functools, "_lru_cache_wrapper", None)  # the C type; None where functools is pure Python
LRU = " (functools.lru_cache)"
# References that objects of these types hold under a name.
_NAMED_REFERENCES = {
    types.MethodType: ("__self__", "__func__"),
    functools.partial: ("func", "args", "keywords"),
}
_EXCEPTION_REFERENCES = ("__traceback__", "__context__", "__cause__", "args")


class Arrival:
    """Where a chain of referrers ends: an object the walk reached, or a name given here.

    ``reached`` is the walk's object (its path and root are the walk's); else
    ``name`` is a root's name as the walk writes them (``global 'table'
    (module helpers)``), ``expr`` how the path starts (``helpers.table``) and
    ``obj`` the object that name refers to.
    """

    __slots__ = ("expr", "name", "obj", "reached")

    def __init__(self, reached=None, name: str = "", expr: str = "", obj=None):
        self.reached, self.name, self.expr, self.obj = reached, name, expr, obj


class Search:
    """The result: how each explained target is reached, what stays unexplained, and what the search cost.

    ``explained`` holds ``(target, arrival, hops)``: ``hops`` are ``(object,
    label)`` from just below the arrival down to the target, so the target's
    path is the arrival's followed by the labels. ``unexplained`` holds
    ``(target, owner)``, ``owner`` saying in words what refers to it.
    """

    def __init__(self):
        self.explained: list[tuple] = []
        self.unexplained: list[tuple] = []
        self.levels = 0
        self.nodes = 0
        self.truncated = ""  # why the search stopped before it ran out of referrers ("" when it did not)
        self.seconds = 0.0


def search(
    targets: list,
    *,
    reached: dict,
    ignore: set,
    torch,
    max_levels: int = MAX_LEVELS,
    max_nodes: int = MAX_NODES,
    time_limit_s: float = TIME_LIMIT_S,
) -> Search:
    """Search back from ``targets`` to objects that can be named.

    Args:
        targets: the objects to explain (tensors, storages).
        reached: ``{id: object}`` of every object the walk reached from a root.
        ignore: ``id()`` of objects that are no owner of the learner's (the
            caller's own containers, the probe); the search adds its own.
        torch: the module that tells tensors apart, for a tensor's ``.grad``.
    """
    result = Search()
    started = time.perf_counter()
    modules = {id(vars(m)): name for name, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)}
    ours = {oid for oid, name in modules.items() if name == "oomlab" or name.startswith("oomlab.")}  # the harness's
    met: dict[int, object] = {id(t): t for t in targets}  # every object met, kept alive so that ids stay theirs
    below: dict[int, list[int]] = collections.defaultdict(list)  # id -> ids of what it refers to, toward a target
    first_above: dict[int, int] = {}  # id -> the first referrer found, for naming what stays unexplained
    strong, weak = [], []  # arrivals: named objects; frames, used only where nothing better refers
    frontier = list(targets)
    own = set(ignore) | ours | {id(met), id(below), id(first_above), id(strong), id(weak), id(targets)}
    while frontier:
        if result.levels >= max_levels:
            result.truncated = f"stopped {max_levels} references back"
            break
        if len(met) >= max_nodes:
            result.truncated = f"stopped after {max_nodes:,} objects"
            break
        if time.perf_counter() - started > time_limit_s:
            result.truncated = f"stopped after {time_limit_s:g} s"
            break
        result.levels += 1
        wanted = tuple(frontier)
        level_ids = {id(o) for o in wanted}
        own.update((id(frontier), id(wanted)))
        referrers = gc.get_referrers(*wanted)  # one pass over every object the collector tracks
        del wanted
        found = []
        for referrer in referrers:
            rid = id(referrer)
            if rid in own or rid in level_ids or _is_own_frame(referrer):
                continue
            for child in gc.get_referents(referrer):
                cid = id(child)
                if cid in level_ids:
                    below[rid].append(cid)
                    first_above.setdefault(cid, rid)
            if rid in met:
                continue
            met[rid] = referrer
            if rid in reached or rid in modules or isinstance(referrer, type):
                strong.append(rid)
            elif isinstance(referrer, types.FrameType):
                weak.append(rid)  # a frame is a name of sorts, but what keeps the frame may be a better one
                found.append(referrer)
            else:
                found.append(referrer)
        del referrers
        frontier = found
    result.nodes = len(met)

    # Down from the arrivals, nearest first: every object gets the shortest chain to a named one.
    parent: dict[int, int] = {}
    for arrivals in (strong, weak):
        queue = collections.deque((a, a) for a in arrivals if a not in parent)
        for a in arrivals:
            parent.setdefault(a, a)
        while queue:
            oid, _ = queue.popleft()
            for cid in below.get(oid, ()):
                if cid not in parent:
                    parent[cid] = oid
                    queue.append((cid, oid))
    for target in targets:
        tid = id(target)
        if tid not in parent:
            result.unexplained.append((target, _owner(tid, first_above, met)))
            continue
        chain = [tid]
        while parent[chain[-1]] != chain[-1]:
            chain.append(parent[chain[-1]])
        arrival, hops = _name_chain([met[i] for i in reversed(chain)], reached, modules, torch)
        result.explained.append((target, arrival, hops))
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _is_own_frame(obj) -> bool:
    """A frame of oomlab's own code (the harness, this search): it holds our work, not the learner's."""
    return isinstance(obj, types.FrameType) and os.path.abspath(obj.f_code.co_filename).startswith(_OOMLAB + os.sep)


def _owner(tid: int, first_above: dict, met: dict) -> str:
    """What refers to an unexplained target, in words: the furthest object up its first referrers."""
    if tid not in first_above:
        return "nothing Python can see (a C++ owner, or a local of code still running)"
    oid, hops = tid, 0
    while oid in first_above and hops < MAX_LEVELS:
        oid, hops = first_above[oid], hops + 1
    return f"a {type(met[oid]).__name__} that no named object reaches ({hops} references up)"


# --------------------------------------------------------------------------- naming a chain


def _name_chain(chain: list, reached: dict, modules: dict, torch) -> tuple[Arrival, list]:
    """``(arrival, hops)`` for ``chain``, the objects from an arrival down to a target."""
    top, rest = chain[0], chain[1:]
    if id(top) in reached:
        return Arrival(reached=top), _hops(top, rest, torch)
    if id(top) in modules:  # a module's global: the name is the module's and the key's
        value, rest = rest[0], rest[1:]
        key = _dict_key(top, value)
        module = modules[id(top)]
        return Arrival(name=f"global {key!r} (module {module})", expr=f"{module}.{key}", obj=value), _hops(value, rest, torch)
    if isinstance(top, type):
        qualified = f"{top.__module__}.{top.__qualname__}"
        if rest and _namespace_of(top) is rest[0] and len(rest) > 1:  # a class attribute
            namespace, value, rest = rest[0], rest[1], rest[2:]
            key = _dict_key(namespace, value)
            expr = f"{qualified}.{key}"
            return Arrival(name=f"class attribute {expr!r}", expr=expr, obj=value), _hops(value, rest, torch)
        return Arrival(name=f"class {qualified!r}", expr=qualified, obj=top), _hops(top, rest, torch)
    # A frame that nothing better refers to: named like the walk's roots, by the local that holds the rest.
    at = place(top.f_code, top.f_lineno)
    value = rest[0]
    for name, local in frame_locals(top):
        if local is value or (isinstance(value, types.CellType) and _cell_holds(value, local)):
            return Arrival(name=f"{func_name(top.f_code)}() local {name!r} ({at})", expr=name, obj=value), _hops(
                value, rest[1:], torch
            )
    expr = f"{func_name(top.f_code)}() frame ({at})"
    return Arrival(name=expr, expr=expr, obj=top), _hops(top, rest, torch)


def _hops(top, chain: list, torch) -> list:
    """``(object, label)`` for each object of ``chain`` below ``top``; an object's ``__dict__`` folds into ``.name``."""
    hops, above, previous = [], top, ""
    for obj in chain:
        kind, text = _edge(above, obj, torch)
        if kind in ("ns", "closure"):  # the next hop is an attribute (``.name``) or a closure's cell (``['name']``)
            owner, above, previous = above, obj, kind
            continue
        if previous == "closure" and isinstance(obj, types.CellType):
            names = owner.__code__.co_freevars
            index = next((i for i, cell in enumerate(above) if cell is obj), None)
            text = f".__closure__[{names[index]!r}]" if index is not None and index < len(names) else ".__closure__"
        if kind == "key":
            if previous == "ns" and isinstance(text, str) and text.isidentifier():
                text = f".{text}"
            else:
                text = _cache_key_label(text) if previous == "lru" else key_label(text)
        hops.append((obj, text))  # a folded __dict__ is no hop: this one hangs from the object that owns it
        above, previous = obj, kind
    return hops


def _edge(above, obj, torch) -> tuple[str, object]:
    """How ``above`` refers to ``obj``: ``("key", key)`` for a dict entry, ``("ns", None)`` for its ``__dict__``, else ``("text", label)``."""
    if isinstance(above, dict):
        for key, value in list(dict.items(above)):
            if value is obj:
                return "key", key
        for i, key in enumerate(list(above)):
            if key is obj:
                return "text", f".keys()[{i}]"
    if isinstance(above, (list, tuple, collections.deque)):
        fields = getattr(type(above), "_fields", None) if isinstance(above, tuple) else None
        for i, value in enumerate(list(above)):
            if value is obj:
                return "text", f".{fields[i]}" if fields and i < len(fields) else f"[{i}]"
    if isinstance(above, (set, frozenset)):
        return "text", " -> set item"
    if _LRU_CACHE is not None and isinstance(above, _LRU_CACHE) and obj is not _own_namespace(above):
        label = _lru_label(above, obj)
        return ("lru" if label == LRU else "text"), label
    if isinstance(above, types.FunctionType):
        if obj is above.__closure__:
            return "closure", None  # the tuple of cells: the cell below is named by its variable
        for name, cell in zip(above.__code__.co_freevars, above.__closure__ or (), strict=False):
            if cell is obj:
                return "text", f".__closure__[{name!r}]"
        for name in ("__defaults__", "__kwdefaults__"):
            if getattr(above, name) is obj:
                return "text", f".{name}"
    if isinstance(above, types.CellType):
        return "text", ""  # the closure's label above already names the variable
    if isinstance(above, types.TracebackType):
        if above.tb_frame is obj:
            return "text", f" -> {func_name(obj.f_code)}() frame ({place(obj.f_code, above.tb_lineno)})"
        return "text", ".tb_next"
    if isinstance(above, types.FrameType):
        for name, value in frame_locals(above):
            if value is obj or (isinstance(obj, types.CellType) and _cell_holds(obj, value)):
                return "text", f" local {name!r}"
        return "text", ".f_back" if obj is above.f_back else f" -> {type(obj).__name__}"
    if isinstance(above, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        return "text", " -> suspended frame"
    named = _NAMED_REFERENCES.get(type(above)) or (_EXCEPTION_REFERENCES if isinstance(above, BaseException) else ())
    for name in named:
        if getattr(above, name, None) is obj:
            return "text", f".{name}"
    if isinstance(above, type):
        return ("ns", None) if _namespace_of(above) is obj else ("text", f" -> {type(obj).__name__}")
    if isinstance(above, torch.Tensor):
        for name in ("grad", "_backward_hooks", "_post_accumulate_grad_hooks"):  # the last two: register_hook's dicts
            if getattr(above, name, None) is obj:
                return "text", f".{name}"
    return _attribute(above, obj)


def _own_namespace(obj):
    """An object's ``__dict__``, read without running its class's code; None when it has none."""
    try:
        return object.__getattribute__(obj, "__dict__")
    except Exception:
        return None


def _attribute(above, obj) -> tuple[str, object]:
    """``obj`` as an attribute of ``above``: its ``__dict__``, one of its entries, or a slot."""
    namespace = _own_namespace(above)
    if namespace is obj:
        return "ns", None
    if isinstance(namespace, dict):  # values kept in the object itself (no dict of their own until asked)
        for name, value in list(dict.items(namespace)):
            if value is obj:
                return "text", f".{name}"
    for cls in type(above).__mro__:
        names = cls.__dict__.get("__slots__", ())
        for name in [names] if isinstance(names, str) else names:
            descriptor = cls.__dict__.get(name)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    if descriptor.__get__(above, cls) is obj:
                        return "text", f".{name}"
                except AttributeError:  # an unset slot
                    continue
    return "text", f" -> {type(obj).__name__}"


def _lru_label(wrapper, obj) -> str:
    """An entry of a ``functools.lru_cache``: `` (functools.lru_cache)[key]``.

    The C wrapper keeps its entries where no attribute reaches them. Without
    a size bound they are a dict (``obj`` is then that dict, and the next hop
    names the key); with one, a linked list that the collector sees as the
    wrapper referring to each key and then its result, in that order, while
    the dict maps each key to its link.
    """
    referents = gc.get_referents(wrapper)
    own = _own_namespace(wrapper)
    caches = [r for r in referents if isinstance(r, dict) and r is not own]
    if any(obj is cache for cache in caches):
        return LRU
    keys = {id(key) for cache in caches for key in cache}
    if id(obj) in keys:
        return f"{LRU} key"
    for before, value in zip(referents, referents[1:], strict=False):
        if value is obj and id(before) in keys:
            return f"{LRU}{_cache_key_label(before)}"
    return LRU


def _cache_key_label(key) -> str:
    """An lru_cache key as the call's arguments: ``[2048]``, ``[(3, 'train')]``; keyword names after the marker are kept."""
    if isinstance(key, tuple):
        parts = [repr(k) if isinstance(k, (str, int, float, bool, type(None))) else f"<{type(k).__name__}>" for k in key]
        parts = [p for p in parts if p != "<object>"]  # the marker between positional and keyword arguments
        text = f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        return f"[{text[:60] + '…' if len(text) > 61 else text}]"
    return key_label(key)


def _dict_key(namespace: dict, value):
    """The key under which ``namespace`` holds ``value``."""
    return next((k for k, v in list(dict.items(namespace)) if v is value), "?")


def _namespace_of(cls: type):
    """A class's own namespace dict (``vars(cls)`` is a read-only view of it)."""
    referents = gc.get_referents(vars(cls))
    return referents[0] if referents else None


def _cell_holds(cell, value) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


# --------------------------------------------------------------------------- between the walk and the search
# The search above knows nothing of the walk but the ids it reached. Here the walk's side: which storages it
# left unreached (the targets), and how each one the search explains goes back into the walk as a root.


def unreached(walk: Walk) -> dict:
    """``{storage key: (bytes, [objects])}``: live tensors and storage objects on the device that no root reached.

    Largest storages first, at most :data:`MAX_TARGETS` of them;
    one ``gc.get_objects()`` pass.
    """
    groups: dict = {}
    tensor, storage = walk.torch.Tensor, walk.Storage
    obj = None
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance(): a proxy's __class__ could run code, or raise
        if issubclass(kind, tensor):
            key, nbytes = storage_key(obj)
        elif storage is not None and issubclass(kind, storage):
            key, nbytes = storage_object_key(obj)
        else:
            continue
        if key is None or key in walk.claims or id(obj) in walk.skip or key[0].split(":")[0] != walk.device_type:
            continue
        groups.setdefault(key, (nbytes, []))[1].append(obj)
    obj = None  # the loop's last object: no reference of ours may outlive the pass
    largest = sorted(groups, key=lambda k: -groups[k][0])[:MAX_TARGETS]
    return {key: groups[key] for key in largest}


class Report:
    """What :func:`search_back` found: its figures, and what it could not name (``[{owner, bytes, storages}]``)."""

    def __init__(self, stats: dict, unexplained: list):
        self.stats, self.unexplained = stats, unexplained


def search_back(walk: Walk, ignore: set) -> Report | None:
    """Name the owners of the device storages the walk did not reach, and hand them to the walk as roots.

    Each target the search explains is handed back to the walk under the root
    its chain arrived at (a root of the walk's, or a module global, class
    attribute or frame local that becomes one), so its storage is claimed there
    and its autograd graph followed like any other. None when the walk left
    nothing unreached: then nothing runs.
    """
    groups = unreached(walk)
    if not groups:
        return None
    targets = [obj for _, objs in groups.values() for obj in objs]
    found = search(targets, reached=walk.seen, ignore=ignore | {id(groups), id(targets)}, torch=walk.torch)
    new_roots: dict[str, int] = {}
    for target, arrival, hops in found.explained:
        if arrival.reached is not None:
            above = id(arrival.reached)
            root = walk.parent[above][2]
        else:
            root = new_roots.get(arrival.name)
            if root is None:
                root = new_roots[arrival.name] = walk.add_root(arrival.name, arrival.obj)
                walk.back_searched.add(root)
            if not hops:  # the name refers to the target itself
                walk.push(target, None, arrival.expr, root, 0, None)
                continue
            above = id(arrival.obj)
            walk.adopt(arrival.obj, None, arrival.expr, root)
        for obj, label in hops[:-1]:
            walk.adopt(obj, above, label, root)
            above = id(obj)
        walk.push(target, above, hops[-1][1], root, 1, None)
    walk.run()
    unexplained: dict[str, list] = {}
    counted: set = set()  # a storage is unexplained once, under the first owner met, however many tensors view it
    for target, owner in found.unexplained:
        key, nbytes = storage_key(target) if isinstance(target, walk.torch.Tensor) else storage_object_key(target)
        if key in walk.claims or key in counted:
            continue  # claimed after all (another object of the same storage, or a graph the walk then followed)
        counted.add(key)
        keys, total = unexplained.get(owner, (set(), 0))
        unexplained[owner] = (keys | {key}, total + nbytes)
    stats = {
        "targets": len(groups),
        "explained": len(groups) - len(counted),
        "levels": found.levels,
        "objects": found.nodes,
        "stopped": found.truncated,
        "seconds": found.seconds,
    }
    rows = [{"owner": owner, "bytes": total, "storages": len(keys)} for owner, (keys, total) in unexplained.items()]
    return Report(stats, sorted(rows, key=lambda r: -r["bytes"]))
