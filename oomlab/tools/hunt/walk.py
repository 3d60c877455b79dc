"""The reference walk: which named object keeps each device tensor storage alive.

The walk starts from named "roots" (:mod:`~oomlab.tools.hunt.roots`: the
script's globals, the locals of its frames, torch's global module hooks, an
exception being handled) and goes
breadth-first from all of them at once, so each storage is credited to the
root that reaches it in the fewest references, and counted once. Besides
ordinary references (attributes, items, closures, frames) it follows the
autograd graph: a tensor's ``grad_fn``, the tensors each node saved for
backward, and the nodes it leads to. What a graph saved is counted apart, since
that is the memory a forward pass without backward leaves behind.

The walk never calls user code on purpose: it reads ``__dict__`` and slots
through ``object.__getattribute__`` and member descriptors, skips modules,
classes (except the script's own) and functions' globals, and bounds itself by
depth and node count.

Then two more passes, each bounded in its own module: the back search
(:mod:`~oomlab.tools.hunt.backsearch`) names the owners of the device storages
no root reached and hands them back to the walk as roots of their own; and the
graph in flight (:mod:`~oomlab.tools.hunt.inflight`) takes what the failing
forward or backward pass saved away from whichever name reached it first.

Device-agnostic and torch-free at import: tensors are recognised through the
torch the caller hands over (or the one the process has already imported), so
the tests walk CPU tensors and the probe walks GPU ones with the same code.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import sys
import threading
import types
import warnings
import weakref

from oomlab.tools.hunt import backsearch, inflight
from oomlab.tools.hunt.paths import frame_locals, func_name, join_path, key_label, place, reads_locals, root_expr

__all__ = ["CYCLE", "IN_FLIGHT", "IN_FLIGHT_GRAPH", "STATE", "find_holders", "model_state_ids"]

MAX_DEPTH = 12  # ordinary references from a root; autograd edges do not count
MAX_NODES = 200_000

# Labels a holder can carry, that the verdict reads.
STATE = "model/optimizer state"
CYCLE = "cycle"
IN_FLIGHT = "in flight"  # the call that was running when the script stopped: its library frames, and its graph
IN_FLIGHT_GRAPH = "the autograd graph of the {phase} in flight when the script stopped"

# Objects that cannot hold a tensor (or that the walk must not enter: modules, classes, code).
_LEAVES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    range,
    slice,
    memoryview,
    type(Ellipsis),
    type(NotImplemented),
    types.ModuleType,
    type,
    types.CodeType,
    weakref.ReferenceType,
    weakref.ProxyType,
    weakref.CallableProxyType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.BuiltinFunctionType,  # builtin methods are handled before this check
)


class _IdSet(set):
    """A set of ``id()`` values that also keeps the objects alive, so no id can be reused by another object."""

    def __init__(self):
        super().__init__()
        self.keep: list = []

    def add_object(self, obj) -> None:
        if id(obj) not in self:
            self.add(id(obj))
            self.keep.append(obj)


def _storage_key(tensor):
    """``(device, data_ptr)`` and byte size of a tensor's storage; ``None`` if it has none we can read."""
    try:
        storage = tensor.untyped_storage()
    except Exception:  # sparse, meta, fake and other storage-less tensors hold nothing we can attribute
        return None, 0
    return _storage_object_key(storage)


def _storage_object_key(storage):
    """:func:`_storage_key` of a storage object itself (``tensor.untyped_storage()`` kept on its own)."""
    try:
        ptr, nbytes, device = storage.data_ptr(), storage.nbytes(), storage.device
    except Exception:  # a storage without data (meta) or of a kind we cannot read
        return None, 0
    if not ptr or not nbytes:
        return None, 0
    return (str(device), ptr), int(nbytes)


class _Walk:
    """Breadth-first walk from every root at once: each storage goes to the root that reaches it first."""

    def __init__(self, torch, device_type, exclude, skip, max_depth, max_nodes, saved_hooks_hidden):
        self.torch = torch
        self.device_type = device_type
        self.exclude = exclude
        self.orphans = getattr(exclude, "orphans", ())  # an optimizer's parameters no module holds (model_state_ids)
        self.skip = set(skip)
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.Node = getattr(getattr(torch.autograd, "graph", None), "Node", None)
        self.leaves = _LEAVES + (torch.device, torch.dtype, torch.Size, torch.Generator)
        self.slot_cache: dict[type, list] = {}
        self.saved_cache: dict[type, list] = {}
        self.seen: dict[int, object] = {}  # keeps every visited object (and unpacked saved tensor) alive
        self.parent: dict[int, tuple] = {}  # id -> (parent's id or None, the edge's label, root index)
        self.names: list[str] = []  # the roots, by index
        self.root_types: dict[int, str] = {}
        self.tensor_roots: set[int] = set()
        self.labels: dict[int, str] = {}  # root index -> a label the verdict reads (CYCLE, IN_FLIGHT)
        self.back_searched: set[int] = set()  # roots that only the back search found (a module global, a class attribute)
        self.Storage = getattr(torch, "UntypedStorage", None)
        self.queue: collections.deque = collections.deque()
        self.claims: dict = {}  # storage key -> [root index, tensor id, graph entry id or None, bytes]
        self.state_keys: set = set()
        self.only: set[int] | None = None  # while walking garbage: ordinary edges stay inside it
        self.truncated = False
        self.depth_limited = False
        self.unreadable_saved = 0
        self.packed_saved = 0
        # Without SavedTensor.unpack_hook (torch 2.4) a hook-packed value looks like any other, and
        # reading it runs the script's unpack hook: after the script used such hooks, read none.
        self.skip_every_saved_value = saved_hooks_hidden
        # A module's namespace is reachable through builtin methods and frames: never enter one.
        self.skip.update(id(vars(m)) for m in list(sys.modules.values()) if isinstance(m, types.ModuleType))

    # -- roots
    def add_root(self, name: str, obj, kind: str = "", label: str = "") -> int:
        """Register a root (a name the walk credits storages to); its index."""
        index = len(self.names)
        self.names.append(name)
        self.root_types[index] = kind or type(obj).__name__
        if isinstance(obj, self.torch.Tensor):
            self.tensor_roots.add(index)
        if label:
            self.labels[index] = label
        return index

    def adopt(self, obj, parent_id, label: str, root: int) -> None:
        """Record ``obj`` as reached (by the back search) without walking on from it: its path is known."""
        if id(obj) not in self.seen:
            self.seen[id(obj)] = obj
            self.parent[id(obj)] = (parent_id, label, root)

    def unreached(self) -> dict:
        """``{storage key: (bytes, [objects])}``: live tensors and storage objects on the device that no root reached.

        Largest storages first, at most :data:`backsearch.MAX_TARGETS` of them;
        one ``gc.get_objects()`` pass.
        """
        groups: dict = {}
        tensor, storage = self.torch.Tensor, self.Storage
        obj = None
        for obj in gc.get_objects():
            kind = type(obj)  # not isinstance(): a proxy's __class__ could run code, or raise
            if issubclass(kind, tensor):
                key, nbytes = _storage_key(obj)
            elif storage is not None and issubclass(kind, storage):
                key, nbytes = _storage_object_key(obj)
            else:
                continue
            if key is None or key in self.claims or id(obj) in self.skip or key[0].split(":")[0] != self.device_type:
                continue
            groups.setdefault(key, (nbytes, []))[1].append(obj)
        obj = None  # the loop's last object: no reference of ours may outlive the pass
        largest = sorted(groups, key=lambda k: -groups[k][0])[: backsearch.MAX_TARGETS]
        return {key: groups[key] for key in largest}

    # -- queueing
    def push(self, obj, parent_id, label, root, depth, entry, graph=False):
        if isinstance(obj, self.leaves):
            if isinstance(obj, type):
                if obj.__module__ != "__main__":  # only the script's own classes can hold its state
                    return
            elif isinstance(obj, types.BuiltinMethodType):
                if isinstance(obj.__self__, (types.ModuleType, type(None), type)):  # a plain builtin function
                    return
            else:
                return
        oid = id(obj)
        if oid in self.seen or oid in self.skip:
            return
        if not graph:
            if depth > self.max_depth:
                self.depth_limited = True
                return
            if self.only is not None and entry is None and oid not in self.only:
                return
        self.queue.append((obj, parent_id, label, root, depth, entry))

    def run(self):
        while self.queue:
            obj, parent_id, label, root, depth, entry = self.queue.popleft()
            oid = id(obj)
            if oid in self.seen:
                continue
            if len(self.seen) >= self.max_nodes:
                self.truncated = True
                self.queue.clear()
                return
            self.seen[oid] = obj
            self.parent[oid] = (parent_id, label, root)
            with contextlib.suppress(Exception):  # an object that refuses to be read holds nothing we can name
                self.expand(obj, oid, root, depth, entry)

    # -- edges
    def expand(self, obj, oid, root, depth, entry):
        torch = self.torch
        child = functools.partial(self.push, parent_id=oid, root=root, entry=entry)
        nxt = depth + 1
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, oid, root, depth, entry)
        if self.Storage is not None and isinstance(obj, self.Storage):
            return self.claim(_storage_object_key(obj), oid, root, entry, state=False)
        if self.Node is not None and isinstance(obj, self.Node):
            return self.node(obj, oid, root, depth, entry)
        if isinstance(obj, torch.nn.Module):
            return self.module(obj, oid, root, depth, entry)
        if isinstance(obj, dict):
            for i, (key, value) in enumerate(list(dict.items(obj))):
                child(value, label=key_label(key), depth=nxt)
                child(key, label=f".keys()[{i}]", depth=nxt)
            return self.attributes(obj, oid, root, depth, entry) if type(obj) is not dict else None
        if isinstance(obj, (list, tuple, collections.deque)):
            fields = getattr(type(obj), "_fields", None) if isinstance(obj, tuple) else None
            items = list(list.__iter__(obj)) if isinstance(obj, list) else list(obj)
            for i, value in enumerate(items):
                name = f".{fields[i]}" if fields and i < len(fields) else f"[{i}]"
                child(value, label=name, depth=nxt)
            if type(obj) in (list, tuple, collections.deque):
                return None
            return self.attributes(obj, oid, root, depth, entry)  # a subclass's own attributes
        if isinstance(obj, (set, frozenset)):
            for i, value in enumerate(list(obj)):
                child(value, label=f" -> set item {i}", depth=nxt)
            return None
        if isinstance(obj, types.FunctionType):
            names = obj.__code__.co_freevars
            for name, cell in zip(names, obj.__closure__ or (), strict=True):
                with contextlib.suppress(ValueError):  # an empty cell
                    child(cell.cell_contents, label=f".__closure__[{name!r}]", depth=nxt)
            for i, value in enumerate(obj.__defaults__ or ()):
                child(value, label=f".__defaults__[{i}]", depth=nxt)
            for key, value in (obj.__kwdefaults__ or {}).items():
                child(value, label=f".__kwdefaults__[{key!r}]", depth=nxt)
            return self.attributes(obj, oid, root, depth, entry)  # function attributes, e.g. __wrapped__
        if isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
            child(obj.__self__, label=".__self__", depth=nxt)
            if isinstance(obj, types.MethodType):
                child(obj.__func__, label=".__func__", depth=nxt)
            return None
        if isinstance(obj, functools.partial):
            child(obj.func, label=".func", depth=nxt)
            child(obj.args, label=".args", depth=nxt)
            child(obj.keywords, label=".keywords", depth=nxt)
            return None
        if isinstance(obj, types.CellType):
            with contextlib.suppress(ValueError):  # an empty cell
                child(obj.cell_contents, label=".cell_contents", depth=nxt)
            return None
        if isinstance(obj, BaseException):
            child(obj.__traceback__, label=".__traceback__", depth=nxt)
            child(obj.__context__, label=".__context__", depth=nxt)
            child(obj.__cause__, label=".__cause__", depth=nxt)
            child(obj.args, label=".args", depth=nxt)
            return self.attributes(obj, oid, root, depth, entry)
        if isinstance(obj, types.TracebackType):
            frame = obj.tb_frame
            where = place(frame.f_code, obj.tb_lineno)
            child(frame, label=f" -> {func_name(frame.f_code)}() frame ({where})", depth=nxt)
            child(obj.tb_next, label=".tb_next", depth=nxt)
            return None
        if isinstance(obj, types.FrameType):
            if not reads_locals(obj) and obj.f_locals is obj.f_globals:
                return None  # a module's frame: its locals are the module namespace
            for name, value in frame_locals(obj):
                child(value, label=f" local {name!r}", depth=nxt)
            return None
        if isinstance(obj, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
            frame = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None)
            if frame is not None:
                child(frame, label=" -> suspended frame", depth=nxt)
            return None
        if isinstance(obj, (staticmethod, classmethod, property)):
            for name in ("__func__", "fget", "fset", "fdel"):
                value = getattr(obj, name, None)
                if value is not None:
                    child(value, label=f".{name}", depth=nxt)
            return None
        if isinstance(obj, type):  # only the script's own classes get here: their class attributes
            for name, value in list(vars(obj).items()):
                if not (name.startswith("__") and name.endswith("__")):
                    child(value, label=f".{name}", depth=nxt)
            return None
        if type(obj).__module__.split(".")[0] == "numpy":
            return None
        if isinstance(obj, threading.local):
            # Its attributes are this thread's; the generic read below sees none (other threads' come after).
            for name, value in list(dict.items(obj.__dict__)):
                child(value, label=f".{name}", depth=nxt)
        if not self.attributes(obj, oid, root, depth, entry) and gc.is_tracked(obj):
            # A C-level object without attributes we can name (iterators, views): follow what it references.
            for value in gc.get_referents(obj):
                child(value, label=f" -> {type(value).__name__}", depth=nxt)
        return None

    def module(self, module, oid, root, depth, entry):
        """A module's submodules, parameters and buffers named as ``named_parameters()`` does, then the rest.

        The rest includes its hook dicts (``_forward_hooks`` and friends) and any
        attribute a custom module stores (``self.cache``).
        """
        namespace = object.__getattribute__(module, "__dict__")
        registries = ("_modules", "_parameters", "_buffers")
        for registry in registries:
            for name, value in list(dict.items(namespace.get(registry) or {})):
                if value is not None:
                    self.push(value, oid, f".{name}", root, depth + 1, entry)
        for name, value in list(dict.items(namespace)):
            if name not in registries:
                self.push(value, oid, f".{name}", root, depth + 1, entry)

    def attributes(self, obj, oid, root, depth, entry) -> bool:
        """Instance ``__dict__`` and ``__slots__``, read without running the class's ``__getattr__``."""
        found = False
        try:
            namespace = object.__getattribute__(obj, "__dict__")
        except Exception:
            namespace = None
        if isinstance(namespace, dict):
            found = True
            for name, value in list(dict.items(namespace)):
                self.push(value, oid, f".{name}", root, depth + 1, entry)
        for cls, name, descriptor in self.slots(type(obj)):
            found = True
            try:
                value = descriptor.__get__(obj, cls)
            except AttributeError:  # an unset slot
                continue
            self.push(value, oid, f".{name}", root, depth + 1, entry)
        return found

    def slots(self, cls) -> list:
        """``(class, name, member descriptor)`` for every ``__slots__`` entry of ``cls`` and its bases."""
        if cls not in self.slot_cache:
            found = []
            for base in cls.__mro__:
                names = base.__dict__.get("__slots__", ())
                for name in [names] if isinstance(names, str) else names:
                    descriptor = base.__dict__.get(name)
                    if isinstance(descriptor, types.MemberDescriptorType):
                        found.append((base, name, descriptor))
            self.slot_cache[cls] = found
        return self.slot_cache[cls]

    def claim(self, found, oid, root, entry, state) -> None:
        """Credit a storage (``(key, nbytes)`` from :func:`_storage_key`) to ``root``, unless a root reached it first."""
        key, nbytes = found
        if key is None or key[0].split(":")[0] != self.device_type:
            return
        if state:
            self.state_keys.add(key)
        if key not in self.claims:
            self.claims[key] = [root, oid, entry, nbytes]

    def tensor(self, t, oid, root, depth, entry):
        # A parameter is model state, unless it is an optimizer's that no module holds any more (see model_state_ids).
        state = oid in self.exclude or (isinstance(t, self.torch.nn.Parameter) and oid not in self.orphans)
        if t.device.type == self.device_type and not t.is_meta:
            self.claim(_storage_key(t), oid, root, entry, state)
        grad_fn = t.grad_fn
        if grad_fn is not None:
            self.push(grad_fn, oid, ".grad_fn", root, depth, entry if entry is not None else id(grad_fn), graph=True)
        if t.is_leaf:
            grad = t.grad
            if grad is not None:
                if state and grad.device.type == self.device_type:
                    key, _ = _storage_key(grad)
                    if key is not None:
                        self.state_keys.add(key)  # a parameter's gradient is model state too
                self.push(grad, oid, ".grad", root, depth + 1, entry)
        self.attributes(t, oid, root, depth, entry)
        # A tensor's hooks (register_hook, register_post_accumulate_grad_hook) live on the tensor, not in its __dict__.
        for name in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            hooks = getattr(t, name, None)
            if hooks:
                self.push(hooks, oid, f".{name}", root, depth + 1, entry)

    def node(self, node, oid, root, depth, entry):
        """An autograd graph node: the tensors it saved for backward, and the nodes it leads to."""
        entry = entry if entry is not None else oid
        kind = type(node)
        if kind not in self.saved_cache:
            self.saved_cache[kind] = [n for n in dir(kind) if n.startswith("_saved_")]
        for name in self.saved_cache[kind]:
            value = self.saved(node, name)
            if isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    self.push(item, oid, f".{name}[{i}]", root, depth, entry, graph=True)
            elif value is not None:
                self.push(value, oid, f".{name}", root, depth, entry, graph=True)
        if hasattr(kind, "saved_tensors"):  # a custom autograd.Function's ctx (a class attribute: no call here)
            try:
                for i, item in enumerate(node.saved_tensors):
                    self.push(item, oid, f".saved_tensors[{i}]", root, depth, entry, graph=True)
            except RuntimeError:  # freed by backward
                pass
        variable = getattr(node, "variable", None) if type(node).__name__ == "AccumulateGrad" else None
        if variable is not None:
            self.push(variable, oid, ".variable", root, depth, entry, graph=True)
        for next_node, _ in node.next_functions or ():
            if next_node is not None:
                self.push(next_node, oid, f" -> {type(next_node).__name__}", root, depth, entry, graph=True)
        self.attributes(node, oid, root, depth, entry)  # a custom Function's ctx attributes

    def saved(self, node, name):
        """One value a node saved; ``None`` when backward freed it (reading it then raises RuntimeError)."""
        raw = getattr(node, "_raw" + name, None)
        if raw is not None and (self.skip_every_saved_value or getattr(raw, "unpack_hook", None) is not None):
            self.packed_saved += 1  # packed by saved-tensor hooks: unpacking would run them (and allocate)
            return None
        try:
            return getattr(node, name)
        except RuntimeError as err:
            if "freed" in str(err):
                return None
            # Modified in place after it was saved: still alive; read it without the version check.
            data = getattr(raw, "data", None) if raw is not None else None
            if data is None:
                self.unreadable_saved += 1
            return data

    # -- paths
    def path(self, oid) -> str:
        labels = []
        while oid is not None:
            oid, label, _ = self.parent[oid]
            labels.append(label)
        return join_path(labels[::-1])


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
            :func:`model_state_ids`); their storages (and parameters' gradients,
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
        ``since_sequence`` saved), ``largest_path`` and ``largest_bytes``,
        ``tensor_root``, ``back_searched`` (a root only the back search
        found) and ``label``. The graph in flight, when the failing
        call's frames hold one, is a holder of its own labelled ``IN_FLIGHT``.
    """
    torch = torch or sys.modules.get("torch")
    if torch is None:
        return []
    walk = _Walk(torch, device_type, exclude, skip, max_depth, max_nodes, saved_hooks_hidden)
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
            found = _search_back(walk, ignore={id(roots), id(getattr(exclude, "keep", None)), *skip})
        phase = _split_in_flight(walk, {n: roots[n] for n in names if n in in_flight}, since_sequence)
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


def _walk_cycles(walk: _Walk) -> None:
    """Credit what only reference cycles keep alive to one more holder, the cycle."""
    garbage = _collect_cyclic_garbage()
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


class _BackSearch:
    """What :func:`_search_back` found: its figures, and what it could not name (``[{owner, bytes, storages}]``)."""

    def __init__(self, stats: dict, unexplained: list):
        self.stats, self.unexplained = stats, unexplained


def _search_back(walk: _Walk, ignore: set) -> _BackSearch | None:
    """Name the owners of the device storages the walk did not reach (see :mod:`~oomlab.tools.hunt.backsearch`).

    Each target the search explains is handed back to the walk under the root
    its chain arrived at (a root of the walk's, or a module global, class
    attribute or frame local that becomes one), so its storage is claimed there
    and its autograd graph followed like any other.
    """
    groups = walk.unreached()
    if not groups:
        return None
    targets = [obj for _, objs in groups.values() for obj in objs]
    found = backsearch.search(targets, reached=walk.seen, ignore=ignore | {id(groups), id(targets)}, torch=walk.torch)
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
        key, nbytes = _storage_key(target) if isinstance(target, walk.torch.Tensor) else _storage_object_key(target)
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
    return _BackSearch(stats, sorted(rows, key=lambda r: -r["bytes"]))


def _split_in_flight(walk: _Walk, frames: dict, since: int | None) -> str:
    """Move what the graph in flight saved to a holder of its own (see :mod:`~oomlab.tools.hunt.inflight`).

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
    nodes = inflight.graph_nodes(frames.values(), walk.torch, since)
    node_ids = {id(node) for node in nodes}
    phase = inflight.phase(frames)
    moved = [
        claim
        for key, claim in walk.claims.items()
        if claim[2] is not None and key not in walk.state_keys and walk.parent[claim[1]][0] in node_ids
    ]
    if not moved:
        return phase if nodes else ""  # a graph in flight whose every saved tensor a name also holds
    index = walk.add_root(IN_FLIGHT_GRAPH.format(phase=phase), None, kind="graph", label=IN_FLIGHT)
    for claim in moved:
        claim[0] = index
    del nodes
    return phase


def _aggregate(walk: _Walk, since: int | None) -> list[dict]:
    """One row per root from the walk's claims; ``since`` (a sequence number) tells this step's graphs from older ones."""
    rows = {}
    sequence_of: dict[int, int | None] = {}  # node id -> its sequence number, read once
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
        else:
            row["graph_bytes"] += nbytes
            row["saved_tensors"] += 1
            row["graph_ids"].add(entry)
            node = walk.parent[tid][0]
            if since is not None and node is not None:
                if node not in sequence_of:
                    sequence_of[node] = inflight.sequence_nr(walk.seen[node])
                number = sequence_of[node]
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


def _on_the_heaviest_branch(walk: _Walk, own: list[tuple[int, int]], largest: int) -> int | None:
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


def model_state_ids(objs, torch=None) -> set:
    """``id()`` of parameters, their gradients, buffers and optimizer state among ``objs``.

    Modules and ``torch.optim.Optimizer`` instances are found in ``objs``, in
    containers and in object attributes a few levels down. The returned set
    keeps the tensors alive, so the ids stay theirs while it lives. ``torch``
    is as for :func:`find_holders`.

    An optimizer can outlive the modules it was made for: a head replaced by a
    new one, with the new head's parameters added as another param group,
    leaves the old head's parameters and their moments in the optimizer,
    trained by nothing. So where modules were found, an ``nn.Parameter`` of an
    optimizer that none of them holds is not model state: its id goes into the
    set's ``orphans`` (kept alive too), and neither it nor its optimizer state
    goes into the set. A tensor that is not an ``nn.Parameter`` (``opt =
    SGD([w])`` on a bare tensor) has no module to belong to, so it is state.
    """
    ids = _IdSet()
    ids.orphans = _IdSet()
    torch = torch or sys.modules.get("torch")
    if torch is None:
        return ids
    seen: set[int] = set()
    stack = [(obj, 0) for obj in objs]
    module_params: set[int] = set()
    optimizers = []

    def add_param(p):
        ids.add_object(p)
        if getattr(p, "grad", None) is not None:
            ids.add_object(p.grad)

    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        try:
            if isinstance(obj, torch.nn.Module):
                for p in obj.parameters():
                    module_params.add(id(p))
                    add_param(p)
                for b in obj.buffers():
                    ids.add_object(b)
                continue
            if isinstance(obj, torch.optim.Optimizer):
                optimizers.append(obj)
                continue
            if depth >= 4 or isinstance(obj, torch.Tensor):
                continue
            if isinstance(obj, dict):
                stack.extend((v, depth + 1) for v in list(dict.values(obj)))
            elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
                stack.extend((v, depth + 1) for v in list(obj))
            else:
                namespace = object.__getattribute__(obj, "__dict__")
                if isinstance(namespace, dict):
                    stack.extend((v, depth + 1) for v in list(dict.values(namespace)))
        except Exception:
            continue
    for optimizer in optimizers:
        try:
            _optimizer_state(optimizer, torch, ids, add_param, module_params)
        except Exception:
            continue
    return ids


def _optimizer_state(optimizer, torch, ids: _IdSet, add_param, module_params: set[int]) -> None:
    """Add ``optimizer``'s parameters and their state to ``ids``, its orphaned parameters to ``ids.orphans``."""

    def orphaned(p) -> bool:
        return bool(module_params) and isinstance(p, torch.nn.Parameter) and id(p) not in module_params

    for group in optimizer.param_groups:
        for p in group["params"]:
            if orphaned(p):
                ids.orphans.add_object(p)
            else:
                add_param(p)
    for p, state in list(optimizer.state.items()):
        if orphaned(p):
            continue
        pending = list(state.values()) if isinstance(state, dict) else [state]
        while pending:
            value = pending.pop()
            if isinstance(value, torch.Tensor):
                ids.add_object(value)
            elif isinstance(value, (list, tuple)):
                pending.extend(value)
            elif isinstance(value, dict):
                pending.extend(value.values())
