"""The reference walk: from named roots, which one keeps each device tensor storage alive.

The walk starts from named "roots" (:mod:`~oomlab.tools.hunt.roots`: the
script's globals, the locals of its frames, torch's global module hooks, an
exception being handled) and goes breadth-first from all of them at once, so
each storage is credited to the root that reaches it in the fewest references,
and counted once. Besides ordinary references (attributes, items, closures,
frames) it follows the autograd graph: a tensor's ``grad_fn``, the tensors
each node saved for backward, and the nodes it leads to. What a graph saved is
counted apart, since that is the memory a forward pass without backward leaves
behind.

The walk never calls user code on purpose: it reads ``__dict__`` and slots
through ``object.__getattribute__`` and member descriptors, skips modules,
classes (except the script's own) and functions' globals, and bounds itself by
depth and node count.

This module is the walker alone: :class:`Walk` keeps, for every object it
reached, the reference it came by (so any path can be written back, in the
notation of :mod:`~oomlab.tools.hunt.paths`) and, for every storage, the root
that claimed it. What counts as model state is decided before it starts
(:mod:`~oomlab.tools.hunt.state`); the passes that run it and turn its claims
into one row per holder are :func:`~oomlab.tools.hunt.holders.find_holders`'s.

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
import weakref

from oomlab.tools.hunt.paths import frame_locals, func_name, join_path, key_label, place, reads_locals

__all__ = ["LEAVES", "MAX_DEPTH", "MAX_NODES", "WEAK_PROXIES", "Walk", "storage_key", "storage_object_key"]

MAX_DEPTH = 12  # ordinary references from a root; autograd edges do not count
MAX_NODES = 200_000

# Objects that cannot hold a tensor (or that the walk must not enter: modules, classes, code).
# model_state_ids (state.py) skips them too, looking for models and optimizers.
LEAVES = (
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


# A weak proxy holds no reference to its object, and one whose object is gone raises ReferenceError at any look,
# isinstance included (which asks it for __class__): the walk tells them by their exact type and passes them by.
WEAK_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


def storage_key(tensor):
    """``(device, data_ptr)`` and byte size of a tensor's storage; ``None`` if it has none we can read.

    Storages, not tensors, are what the walk counts: a view and its base share
    one, and the memory is there once however many tensors look at it.
    """
    try:
        storage = tensor.untyped_storage()
    except Exception:  # sparse, meta, fake and other storage-less tensors hold nothing we can attribute
        return None, 0
    return storage_object_key(storage)


def storage_object_key(storage):
    """:func:`storage_key` of a storage object itself (``tensor.untyped_storage()`` kept on its own)."""
    try:
        ptr, nbytes, device = storage.data_ptr(), storage.nbytes(), storage.device
    except Exception:  # a storage without data (meta) or of a kind we cannot read
        return None, 0
    if not ptr or not nbytes:
        return None, 0
    return (str(device), ptr), int(nbytes)


class Walk:
    """Breadth-first walk from every root at once: each storage goes to the root that reaches it first."""

    def __init__(self, torch, device_type, exclude, skip, max_depth, max_nodes, saved_hooks_hidden):
        self.torch = torch
        self.device_type = device_type
        self.exclude = exclude
        self.orphans = getattr(exclude, "orphans", ())  # an optimizer's parameters no module holds (state.py)
        self.skip = set(skip)
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.Node = getattr(getattr(torch.autograd, "graph", None), "Node", None)
        self.leaves = LEAVES + (torch.device, torch.dtype, torch.Size, torch.Generator)
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

    # -- roots (the names storages are credited to; where they come from is roots.py's)
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

    # -- queueing
    def push(self, obj, parent_id, label, root, depth, entry, graph=False):
        if type(obj) in WEAK_PROXIES:
            return
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
            return self.claim(storage_object_key(obj), oid, root, entry, state=False)
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
        """Credit a storage (``(key, nbytes)`` from :func:`storage_key`) to ``root``, unless a root reached it first."""
        key, nbytes = found
        if key is None or key[0].split(":")[0] != self.device_type:
            return
        if state:
            self.state_keys.add(key)
        if key not in self.claims:
            self.claims[key] = [root, oid, entry, nbytes]

    def tensor(self, t, oid, root, depth, entry):
        # A parameter is model state, unless it is an optimizer's that no module holds any more (see state.py).
        state = oid in self.exclude or (isinstance(t, self.torch.nn.Parameter) and oid not in self.orphans)
        if t.device.type == self.device_type and not t.is_meta:
            self.claim(storage_key(t), oid, root, entry, state)
        grad_fn = t.grad_fn
        if grad_fn is not None:
            self.push(grad_fn, oid, ".grad_fn", root, depth, entry if entry is not None else id(grad_fn), graph=True)
        if t.is_leaf:
            grad = t.grad
            if grad is not None:
                if state and grad.device.type == self.device_type:
                    key, _ = storage_key(grad)
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
