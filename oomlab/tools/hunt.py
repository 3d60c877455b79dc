"""Step 2 of the workflow: find the device memory that outlives a step, and name what holds it.

Memory that survives from one training step to the next is almost always held
by a Python name: a list that keeps every batch's loss (and, through the
loss's autograd graph, every activation that forward pass saved), a forward
hook that appends outputs to a closure's list, an exception kept for later
whose traceback keeps a failed batch's frame alive, or objects in a
reference cycle that only the garbage collector can free.

This module walks the references from named starting points ("roots": the
script's globals, the locals of its frames) and attributes every device tensor
storage it finds to one root, counting each storage once. It has four parts:

- the **walk** (:func:`find_holders`, :func:`roots_from`,
  :func:`model_state_ids`), pure Python over any objects, device-agnostic so
  the tests can use CPU tensors;
- the **verdict** (:func:`summarize`), pure over the walk's plain-data holders;
- the **probe** (:func:`start`, :func:`finish`), which runs inside the
  measuring process: an optimizer step hook records ``memory_allocated()``
  after every step and what each root held after step 1 (the baseline), and
  ``finish`` walks the roots when the script stopped and writes ``hunt.json``;
- the **parent side** (:func:`render`, :func:`draw`), which needs no torch.

The walk never calls user code on purpose: it reads ``__dict__`` and slots
through ``object.__getattribute__`` and member descriptors, skips modules,
classes (except the script's own) and functions' globals, and bounds itself by
depth and node count.
"""

from __future__ import annotations

import collections
import functools
import gc
import json
import os
import re
import sys
import textwrap
import types
import warnings
import weakref
from pathlib import Path
from oomlab.units import MIB

TOOL = "hunt"
CO_OPTIMIZED = 0x0001  # inspect.CO_OPTIMIZED, without importing inspect into the learner's process
MAX_DEPTH = 12  # ordinary references from a root; autograd edges do not count
MAX_NODES = 200_000
MAX_STEPS = 100_000  # allocated-bytes samples kept, one int per optimizer step
TOP_HOLDERS = 20
STATE = "model/optimizer state"
IN_FLIGHT = "in flight"
CYCLE = "cycle"
CONTEXT_ROOT = "exception 'exc.__context__' being handled when the script failed"
KINDS = ("graph-leak", "container-leak", "cycle", "held", "none", "error")

ADVICE = {
    "graph-leak": (
        "These tensors still carry the autograd graph of a forward pass that never ran backward, so every "
        "activation that graph saved stays on the device. Run that code under torch.no_grad() (or "
        "torch.inference_mode()) when no gradient is needed, or keep loss.item() / tensor.detach() "
        "instead of the tensor."
    ),
    "container-leak": (
        "This holder gains tensors every step and never lets go of them. Keep Python numbers (.item()), "
        "move what you must keep to the CPU (.cpu()), or bound what it keeps."
    ),
    "traceback": (
        "An exception keeps its traceback, and the traceback keeps every frame it passed through with all "
        "their local variables: the failed batch, its activations, its graph. Keep str(err) instead of the "
        "exception, and retry after the except block has ended, not inside it."
    ),
    "cycle": (
        "These objects reference each other, so reference counting never frees them; only the garbage "
        "collector does, and it runs rarely. Break the cycle (a weakref, or del the attribute when done) "
        "or call gc.collect() before memory runs out."
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


# --------------------------------------------------------------------------- the walk

# Objects that cannot hold a tensor (or that the walk must not enter: modules, classes, code).
_LEAVES = (
    type(None), bool, int, float, complex, str, bytes, bytearray, range, slice, memoryview,
    type(Ellipsis), type(NotImplemented), types.ModuleType, type, types.CodeType,
    weakref.ReferenceType, weakref.ProxyType, weakref.CallableProxyType,
    types.GetSetDescriptorType, types.MemberDescriptorType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.BuiltinFunctionType,  # builtin methods are handled before this check
)


class Roots(dict):
    """``{name: object}`` starting points, plus which names are frames of the call that was running.

    ``in_flight`` names the locals of library frames below the script's own
    frames when it failed (``Linear.forward() local 'input'``): the operation in
    progress, not something kept from earlier.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight: set[str] = set()


class _IdSet(set):
    """A set of ``id()`` values that also keeps the objects alive, so no id can be reused by another object."""

    def __init__(self):
        super().__init__()
        self.keep: list = []

    def add_object(self, obj) -> None:
        if id(obj) not in self:
            self.add(id(obj))
            self.keep.append(obj)


def _root_expr(name: str) -> str:
    """The Python name inside a root's label: ``"f() local 'x' (a.py:3)"`` -> ``x``."""
    match = re.search(r"'([^']+)'", name)
    return match.group(1) if match else name


def _key_label(key) -> str:
    if isinstance(key, (str, int, float, bool, type(None))):
        text = repr(key)
        return f"[{text[:40] + '…' if len(text) > 41 else text}]"
    return f"[<{type(key).__name__}>]"


def _where(code, line) -> str:
    return f"{_short_file(code.co_filename)}:{line}"


def _short_file(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return parts[-1]


def _func_name(code) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _frame_locals(frame) -> list:
    """``(name, value)`` of a frame's local variables, leaving nothing behind in the frame.

    Before Python 3.13, reading ``f_locals`` of a function's frame stores a
    dict snapshot in the frame, which would keep today's values alive after the
    function rebinds them (a suspended generator, a loop still running): the
    probe would change the memory it measures. So the snapshot is emptied
    again; the function's real variables are not in it.
    """
    namespace = frame.f_locals
    items = list(namespace.items())
    if sys.version_info < (3, 13) and frame.f_code.co_flags & CO_OPTIMIZED and isinstance(namespace, dict):
        namespace.clear()
    return items


def _storage_key(tensor):
    """``(device, data_ptr)`` and byte size of a tensor's storage; ``None`` if it has none we can read."""
    try:
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
    except Exception:  # sparse, meta, fake and other storage-less tensors hold nothing we can attribute
        return None, 0
    if not ptr or not nbytes:
        return None, 0
    return (str(tensor.device), ptr), int(nbytes)


class _Walk:
    """Breadth-first walk from every root at once: each storage goes to the root that reaches it first."""

    def __init__(self, torch, device_type, exclude, skip, max_depth, max_nodes):
        self.torch = torch
        self.device_type = device_type
        self.exclude = exclude
        self.skip = set(skip)
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.Node = getattr(getattr(torch.autograd, "graph", None), "Node", None)
        self.leaves = _LEAVES + (torch.device, torch.dtype, torch.Size, torch.Generator)
        self.slot_cache: dict[type, list] = {}
        self.saved_cache: dict[type, list] = {}
        self.seen: dict[int, object] = {}  # keeps every visited object (and unpacked saved tensor) alive
        self.parent: dict[int, tuple] = {}
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
        self.skip_every_saved_value = _probe.get("saved_hooks_entered", False) and not saved_hooks_visible(torch)
        # A module's namespace is reachable through builtin methods and frames: never enter one.
        self.skip.update(id(vars(m)) for m in list(sys.modules.values()) if isinstance(m, types.ModuleType))

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
            self.parent[oid] = (parent_id, label)
            try:
                self.expand(obj, oid, root, depth, entry)
            except Exception:  # an object that refuses to be read holds nothing we can name
                pass

    # -- edges
    def expand(self, obj, oid, root, depth, entry):
        torch = self.torch
        child = functools.partial(self.push, parent_id=oid, root=root, entry=entry)
        nxt = depth + 1
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, oid, root, depth, entry)
        if self.Node is not None and isinstance(obj, self.Node):
            return self.node(obj, oid, root, depth, entry)
        if isinstance(obj, torch.nn.Module):
            return self.module(obj, oid, root, depth, entry)
        if isinstance(obj, dict):
            for i, (key, value) in enumerate(list(dict.items(obj))):
                child(value, label=_key_label(key), depth=nxt)
                child(key, label=f".keys()[{i}]", depth=nxt)
            return self.attributes(obj, oid, root, depth, entry) if type(obj) is not dict else None
        if isinstance(obj, (list, tuple, collections.deque)):
            fields = getattr(type(obj), "_fields", None) if isinstance(obj, tuple) else None
            items = list(list.__iter__(obj)) if isinstance(obj, list) else list(obj)
            for i, value in enumerate(items):
                name = f".{fields[i]}" if fields and i < len(fields) else f"[{i}]"
                child(value, label=name, depth=nxt)
            return self.attributes(obj, oid, root, depth, entry) if type(obj) not in (list, tuple, collections.deque) else None
        if isinstance(obj, (set, frozenset)):
            for i, value in enumerate(list(obj)):
                child(value, label=f" -> set item {i}", depth=nxt)
            return None
        if isinstance(obj, types.FunctionType):
            names = obj.__code__.co_freevars
            for name, cell in zip(names, obj.__closure__ or ()):
                try:
                    child(cell.cell_contents, label=f".__closure__[{name!r}]", depth=nxt)
                except ValueError:  # an empty cell
                    pass
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
            try:
                child(obj.cell_contents, label=".cell_contents", depth=nxt)
            except ValueError:
                pass
            return None
        if isinstance(obj, BaseException):
            child(obj.__traceback__, label=".__traceback__", depth=nxt)
            child(obj.__context__, label=".__context__", depth=nxt)
            child(obj.__cause__, label=".__cause__", depth=nxt)
            child(obj.args, label=".args", depth=nxt)
            return self.attributes(obj, oid, root, depth, entry)
        if isinstance(obj, types.TracebackType):
            frame = obj.tb_frame
            child(frame, label=f" -> {_func_name(frame.f_code)}() frame ({_where(frame.f_code, obj.tb_lineno)})", depth=nxt)
            child(obj.tb_next, label=".tb_next", depth=nxt)
            return None
        if isinstance(obj, types.FrameType):
            if not obj.f_code.co_flags & CO_OPTIMIZED and obj.f_locals is obj.f_globals:
                return None  # a module's frame: its locals are the module namespace
            for name, value in _frame_locals(obj):
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

    def tensor(self, t, oid, root, depth, entry):
        state = oid in self.exclude or isinstance(t, self.torch.nn.Parameter)
        if t.device.type == self.device_type and not t.is_meta:
            key, nbytes = _storage_key(t)
            if key is not None:
                if state:
                    self.state_keys.add(key)
                if key not in self.claims:
                    self.claims[key] = [root, oid, entry, nbytes]
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
            oid, label = self.parent[oid]
            labels.append(label)
        return _join_path(labels[::-1])


def _join_path(labels: list[str], keep_hops: int = 2) -> str:
    """Join edge labels into one path, shortening long runs of autograd node hops."""
    hops = [i for i, label in enumerate(labels) if re.fullmatch(r" -> \w*Backward\w*", label)]
    if len(hops) > 2 * keep_hops + 1:
        elided = hops[keep_hops:-keep_hops]
        labels = labels[: elided[0]] + [f" -> … {len(elided)} nodes …"] + labels[elided[-1] + 1 :]
    return "".join(labels).strip()


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
        type(o).__name__ for o in objects
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
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    report: dict | None = None,
) -> list[dict]:
    """Attribute every ``device_type`` tensor storage reachable from ``roots`` to one root.

    Args:
        roots: ``{name: object}``, e.g. ``{"evaluate() local 'losses' (train.py:40)": losses}``.
            The walk starts from all of them at once, so a storage shared by two
            roots goes to the one that reaches it in fewer references (the
            earlier root on a tie): each storage is counted once. Names in
            ``roots.in_flight`` (a :class:`Roots`) are walked after all others.
        device_type: only storages on this device type count (``"cpu"`` in tests).
        exclude: ``id()`` of tensors that are model/optimizer state (see
            :func:`model_state_ids`); their storages (and parameters' gradients,
            and any ``nn.Parameter``) count as ``state_bytes``, not as a culprit.
        skip: ``id()`` of objects never to enter.
        cycles: also ask the garbage collector which objects only a reference
            cycle keeps alive, and report what they hold as one more holder.
        report: if given, filled with what the walk itself saw (nodes,
            truncated, unreadable saved tensors).

    Returns:
        One dict per root (and per cycle) that holds any such storage, largest
        ``bytes`` first, with ``name``, ``type``, ``bytes`` (all it holds),
        ``state_bytes``, ``direct_bytes`` (plain references), ``graph_bytes``
        (saved by autograd graphs), ``tensors`` and ``saved_tensors`` (storages
        behind those), ``graphs`` (graphs that keep saved tensors),
        ``largest_path`` and ``largest_bytes``, ``tensor_root`` and ``label``.
    """
    import torch

    walk = _Walk(torch, device_type, exclude, skip, max_depth, max_nodes)
    names = list(roots)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading attributes must not print into the learner's output
        # The call in progress (library frames) goes last, so what a script name also holds is credited to it.
        in_flight = getattr(roots, "in_flight", set())
        for wave in (False, True):
            for index, name in enumerate(names):
                if (name in in_flight) == wave:
                    walk.push(roots[name], None, _root_expr(name), index, 0, None)
            walk.run()
        root_types = {i: type(roots[n]).__name__ for i, n in enumerate(names)}
        tensor_roots = {i for i, n in enumerate(names) if isinstance(roots[n], torch.Tensor)}
        labels = {}
        if cycles and not walk.truncated:
            garbage = _collect_cyclic_garbage()
            if garbage:
                index = len(names)
                names.append(_cycle_name(garbage, torch))
                root_types[index], labels[index] = "cycle", CYCLE
                walk.only = {id(o) for o in garbage}
                # Start from the objects that hold things, then the dicts and tensors nothing in the
                # cycle led to: a tensor is then named by the attribute that holds it.
                for wave in (lambda o: not isinstance(o, (torch.Tensor, dict)), lambda o: isinstance(o, dict), None):
                    for obj in garbage:
                        if wave is None or wave(obj):
                            walk.push(obj, None, f"<{type(obj).__name__} in cycle>", index, 0, None)
                    walk.run()
                del garbage
        holders = _aggregate(walk, names, root_types, tensor_roots, labels)
    if report is not None:
        report.update(
            nodes=len(walk.seen),
            truncated=walk.truncated,
            depth_limited=walk.depth_limited,
            unreadable_saved=walk.unreadable_saved,
            packed_saved=walk.packed_saved,
        )
    return holders


def _aggregate(walk: _Walk, names, root_types, tensor_roots, labels) -> list[dict]:
    rows = {}
    for key, (root, tid, entry, nbytes) in walk.claims.items():
        row = rows.setdefault(root, {
            "bytes": 0, "state_bytes": 0, "direct_bytes": 0, "graph_bytes": 0,
            "tensors": 0, "saved_tensors": 0, "graph_ids": set(), "largest": (0, None), "largest_state": (0, None),
        })
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
        row["largest"] = max(row["largest"], (nbytes, tid), key=lambda x: x[0])
    holders = []
    for root, row in rows.items():
        largest_bytes, tid = row["largest"] if row["largest"][1] is not None else row["largest_state"]
        only_state = row["state_bytes"] == row["bytes"]
        holders.append({
            "name": names[root],
            "type": root_types[root],
            "bytes": row["bytes"],
            "state_bytes": row["state_bytes"],
            "direct_bytes": row["direct_bytes"],
            "graph_bytes": row["graph_bytes"],
            "tensors": row["tensors"],
            "saved_tensors": row["saved_tensors"],
            "graphs": len(row["graph_ids"]),
            "largest_path": walk.path(tid) if tid is not None else "",
            "largest_bytes": largest_bytes,
            "tensor_root": root in tensor_roots,
            "label": labels.get(root) or (STATE if only_state else ""),
        })
    holders.sort(key=lambda h: (-h["bytes"], h["name"]))
    return holders


# --------------------------------------------------------------------------- roots and model state


_GRADERS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the oomlab package


def _is_learner_file(filename: str, script_path) -> bool:
    """The script itself, or a file in its folder (a helper module), but never an installed package or us."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    script = os.path.abspath(str(script_path))
    if path == script:
        return True
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts or "dist-packages" in parts or path.startswith(_GRADERS_DIR + os.sep):
        return False
    return path.startswith(os.path.dirname(script) + os.sep)


def _global_roots(namespace: dict, suffix: str = "") -> dict:
    roots = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType) or (isinstance(value, type) and value.__module__ != "__main__"):
            continue
        roots[f"global {name!r}{suffix}"] = value
    return roots


def _reads_locals(frame) -> bool:
    """A function's frame (``CO_OPTIMIZED``): its ``f_locals`` is a view of its variables.

    A module's frame has its globals there, and a class body or ``exec`` frame
    a real namespace that must never be touched.
    """
    return bool(frame.f_code.co_flags & CO_OPTIMIZED)


def _frame_roots(frames: list, script_path, *, library: bool = True) -> tuple[dict, dict, dict]:
    """Locals of learner frames (innermost first), their globals, and the in-flight library frames' locals.

    ``frames`` is outermost first, as ``(frame, line)``. Everything below the
    first learner frame is the call in progress: library frames there are
    "in flight" (read only with ``library=True``).
    """
    first = next((i for i, (f, _) in enumerate(frames) if _is_learner_file(f.f_code.co_filename, script_path)), None)
    if first is None:
        return {}, {}, {}
    script = os.path.abspath(str(script_path))
    locals_, globals_, in_flight, in_flight_names = {}, {}, {}, set()
    main_globals = None
    for frame, line in reversed(frames[first:]):
        code = frame.f_code
        learner = _is_learner_file(code.co_filename, script_path)
        if learner and os.path.abspath(code.co_filename) == script:
            main_globals = frame.f_globals
        if not _reads_locals(frame) or not (learner or library):
            continue
        where = _where(code, line)
        for name, value in _frame_locals(frame):
            root = f"{_func_name(code)}() local {name!r} ({where})"
            if learner:
                locals_[root] = value
            else:
                in_flight[root] = value
                in_flight_names.add(root)
    if main_globals is not None:
        globals_.update(_global_roots(main_globals))
    for frame, _ in frames[first:]:  # helper modules next to the script
        if _is_learner_file(frame.f_code.co_filename, script_path) and frame.f_globals is not main_globals:
            for name, value in _global_roots(frame.f_globals, f" ({_short_file(frame.f_code.co_filename)})").items():
                globals_.setdefault(name, value)
    return locals_, globals_, {"library": in_flight, "in_flight": in_flight_names}


def _hook_roots() -> dict:
    """``torch.nn.modules.module``'s global hook dicts: hooks registered for every module."""
    module = sys.modules.get("torch.nn.modules.module")
    roots = {}
    for name, value in sorted(vars(module).items()) if module else ():
        if name.startswith("_global_") and name.endswith("hooks") and isinstance(value, dict) and value:
            roots[f"torch.nn global hooks {name!r}"] = value
    return roots


def _assemble(locals_, globals_, extra, script_globals=None, exc=None) -> Roots:
    roots = Roots(locals_)
    if script_globals is not None:
        roots.update({k: v for k, v in _global_roots(script_globals).items() if k not in roots})
    for name, value in globals_.items():
        roots.setdefault(name, value)
    for name, value in extra.get("library", {}).items():
        roots.setdefault(name, value)
    roots.in_flight = set(extra.get("in_flight", ()))
    roots.update(_hook_roots())
    # An exception raised while handling another (an OOM-retry loop) keeps the first one as its
    # context, and the first one's traceback keeps the frames of the failed attempt, batch and all.
    context = exc.__context__ if exc is not None else None
    if context is not None:
        roots[CONTEXT_ROOT] = context
    last = getattr(sys, "last_value", None)
    if last is not None and last is not exc:
        roots["sys.last_value"] = last
    return roots


def roots_from(exc: BaseException | None, script_globals: dict | None, script_path) -> Roots:
    """Named starting points for the walk when the script stopped.

    From ``exc``'s traceback: the locals of every frame from the script's first
    frame down to where it raised, named ``"evaluate() local 'losses'
    (train.py:40)"`` with the line each frame was at (library frames below the
    script are listed in ``.in_flight``); the script's globals, named ``"global
    'x'"`` (from ``script_globals`` if given, else from the frames); torch's
    global module hooks; the exception that was being handled when ``exc`` was
    raised (``exc.__context__``: an OOM-retry loop's first failure, whose
    traceback keeps the failed attempt's frames); and ``sys.last_value`` when
    it is another exception.
    """
    frames = []
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    locals_, globals_, extra = _frame_roots(frames, script_path) if frames else ({}, {}, {})
    return _assemble(locals_, globals_, extra or {}, script_globals, exc)


def roots_from_stack(frame, script_path) -> Roots:
    """Named starting points from a live stack (``sys._getframe()``), for a baseline taken mid-run.

    Only the script's frames and globals: the library frames on the stack then
    are the optimizer's own step.
    """
    frames = []
    while frame is not None:
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    locals_, globals_, _ = _frame_roots(frames, script_path, library=False)
    return _assemble(locals_, globals_, {})


def model_state_ids(objs) -> set:
    """``id()`` of parameters, their gradients, buffers and optimizer state among ``objs``.

    Modules and ``torch.optim.Optimizer`` instances are found in ``objs``, in
    containers and in object attributes a few levels down. The returned set
    keeps the tensors alive, so the ids stay theirs while it lives.
    """
    import torch

    ids = _IdSet()
    seen: set[int] = set()
    stack = [(obj, 0) for obj in objs]

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
                    add_param(p)
                for b in obj.buffers():
                    ids.add_object(b)
                continue
            if isinstance(obj, torch.optim.Optimizer):
                for group in obj.param_groups:
                    for p in group["params"]:
                        add_param(p)
                for state in obj.state.values():
                    pending = list(state.values()) if isinstance(state, dict) else [state]
                    while pending:
                        value = pending.pop()
                        if isinstance(value, torch.Tensor):
                            ids.add_object(value)
                        elif isinstance(value, (list, tuple)):
                            pending.extend(value)
                        elif isinstance(value, dict):
                            pending.extend(value.values())
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
    return ids


# --------------------------------------------------------------------------- the verdict


def _stable(name: str) -> str:
    """A root's name without its line number, to match the same local at two moments."""
    return re.sub(r" \([^()]*:\d+\)$", "", name)


def _mib(nbytes: float) -> str:
    if abs(nbytes) >= 10 * MIB:
        return f"{nbytes / MIB:,.0f} MiB"
    if abs(nbytes) >= MIB / 10:
        return f"{nbytes / MIB:.1f} MiB"
    return f"{nbytes / 1024:.1f} KiB"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def describe(name: str, type_name: str = "") -> str:
    """``"evaluate() local 'losses' (train.py:40)"``, ``list`` -> ``list `losses` (local of evaluate() at train.py:40)``."""
    kind = "tensor" if type_name in ("Tensor", "Parameter") else type_name
    match = re.fullmatch(r"(.+?) local '(.+)' \((.+)\)", name)
    if match:
        func, var, where = match.groups()
        return f"{kind} `{var}` (local of {func} at {where})".strip()
    match = re.fullmatch(r"global '(.+)'( \((.+)\))?", name)
    if match:
        var, _, where = match.groups()
        return f"{kind} `{var}` (global{' in ' + where if where else ''})".strip()
    if name == CONTEXT_ROOT:
        return f"the {kind} being handled when the script failed (its traceback keeps that attempt's frames)"
    return name if kind in ("", "cycle") else f"{kind} {name}"


def _own(h: dict) -> int:
    return h["bytes"] - h["state_bytes"]


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
    if h["graph_bytes"] > h["direct_bytes"] and h["graph_bytes"] >= min_bytes:
        if not h["tensor_root"] or h["graphs"] >= 2 or kept:
            return "graph-leak"
    if kept:
        return "container-leak"
    return None


def summarize(
    holders: list[dict],
    *,
    allocated: int | None = None,
    reserved: int | None = None,
    steps: list[int] | None = None,
    baseline: dict | None = None,
    baseline_step: int | None = 1,
    in_flight: set = frozenset(),
    min_bytes: int = MIB,
) -> dict:
    """Turn the walk's holders into ``hunt.json``: a kind, a headline and the culprit's bytes.

    ``baseline`` maps a root's name without its line (see :func:`_stable`) to
    the non-state bytes it held after optimizer step ``baseline_step``; a holder
    that holds ``min_bytes`` more now is "surviving across steps".
    """
    holders = [dict(h) for h in holders]
    for h in holders:
        h["what"] = describe(h["name"], h["type"])
        before = None if baseline is None else baseline.get(_stable(h["name"]))
        h["baseline_bytes"] = before
        h["grew_bytes"] = None if before is None else _own(h) - before
        h["surviving"] = bool(h["grew_bytes"] is not None and h["grew_bytes"] >= min_bytes)
        if h["name"] in in_flight and not h["label"]:
            h["label"] = IN_FLIGHT
    candidates = [h for h in holders if h["label"] not in (IN_FLIGHT, STATE) and _own(h) >= min_bytes]
    signed = [(h, _leak_sign(h, min_bytes)) for h in candidates]
    signed = [(h, sign) for h, sign in signed if sign]
    own_total = sum(_own(h) for h in holders if h["label"] != IN_FLIGHT)
    culprit, kind = None, "none"
    if signed:
        culprit, kind = max(signed, key=lambda pair: _own(pair[0]))
    else:
        kept = [h for h in candidates if not h["tensor_root"] and h["tensors"] + h["saved_tensors"] >= 2]
        kept = [h for h in kept if _own(h) >= 0.25 * own_total]
        if kept:
            culprit, kind = max(kept, key=_own), "held"
    if culprit is not None:
        culprit["label"] = "culprit" if culprit["label"] != CYCLE else "culprit (cycle)"

    explained = sum(h["bytes"] for h in holders)
    state = sum(h["state_bytes"] for h in holders)
    result = {
        "tool": TOOL,
        "kind": kind,
        "headline": _headline(kind, culprit, allocated=allocated, baseline_step=baseline_step,
                              has_baseline=baseline is not None, state=state, current=own_total),
        "culprit_bytes": _own(culprit) if culprit else 0,
        "culprit": culprit["name"] if culprit else None,
        "advice": ADVICE["traceback"] if culprit and _via_traceback(culprit) else ADVICE[kind],
        "holders": holders[:TOP_HOLDERS],
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "explained_bytes": explained,
        "state_bytes": state,
        "in_flight_bytes": sum(_own(h) for h in holders if h["label"] == IN_FLIGHT),
        "steps": list(steps or []),
        "baseline_step": baseline_step if baseline is not None else None,
    }
    return result


def _headline(kind, h, *, allocated, baseline_step, has_baseline, state, current) -> str:
    share = f" ({100 * _own(h) / allocated:.0f}% of the {_mib(allocated)} allocated)" if h and allocated else ""
    if kind == "graph-leak":
        graphs = "autograd graph keeps" if h["graphs"] == 1 else "autograd graphs keep"
        held = f"holds {_plural(h['tensors'], 'tensor')} whose {graphs}" if h["tensors"] else f"holds {_plural(h['graphs'], 'autograd graph')} that keep"
        return f"{h['what']} {held} {_mib(h['graph_bytes'])} of saved activations{share}"
    if kind == "container-leak" and _via_traceback(h) and not h.get("surviving"):
        return (f"{h['what']} keeps {_plural(h['tensors'] + h['saved_tensors'], 'tensor')}, {_mib(_own(h))}, "
                f"alive through an exception's traceback ({h['largest_path']}){share}")
    if kind == "container-leak":
        return (f"{h['what']} holds {_plural(h['tensors'] + h['saved_tensors'], 'tensor')}, {_mib(_own(h))}, "
                f"and grew by {_mib(h['grew_bytes'])} since optimizer step {baseline_step}{share}")
    if kind == "cycle":
        return (f"{_plural(h['tensors'] + h['saved_tensors'], 'tensor')} {'is' if h['tensors'] + h['saved_tensors'] == 1 else 'are'} "
                f"held only by a {h['name']}: gc.collect() frees {_mib(_own(h))}{share}")
    if kind == "held":
        why = ("it did not grow across optimizer steps" if has_baseline
               else "no optimizer step had run, so growth across steps could not be checked")
        return f"{h['what']} holds {_plural(h['tensors'] + h['saved_tensors'], 'tensor')}, {_mib(_own(h))}{share}; {why}"
    of = f" of the {_mib(allocated)} allocated" if allocated else ""
    return (f"nothing outlives its step: {_mib(state)}{of} is model/optimizer state and "
            f"{_mib(current)} the current step's tensors")


# --------------------------------------------------------------------------- the probe

_probe: dict = {}


def _device_type(torch, options: dict) -> str:
    return options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")


def _allocated(torch, device_type: str):
    if device_type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())
    return None, None


def start(torch, out_dir: Path, options: dict) -> None:
    """Record ``memory_allocated()`` after every optimizer step, and what each root held after step 1.

    ``options``: ``script`` (the learner's file; default ``sys.argv[0]`` when a
    step happens), ``device`` (``"cuda"``, or ``"cpu"`` without a GPU),
    ``min_bytes`` (smallest growth or holder worth naming, default 1 MiB),
    ``baseline_step`` (default 1).
    """
    _probe.clear()
    _probe.update(torch=torch, options=dict(options or {}), steps=[], step_count=0,
                  baseline=None, errors=[], handle=None, saved_hooks_entered=False, restore=None)
    if not saved_hooks_visible(torch):
        _watch_saved_hooks(torch)
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _probe["handle"] = register_optimizer_step_post_hook(_after_step)
    except Exception as err:  # torch without global optimizer hooks: the final walk still works
        _probe["errors"].append(f"no optimizer step hook: {type(err).__name__}: {err}")


def saved_hooks_visible(torch) -> bool:
    """Whether this torch tells a value packed by ``saved_tensors_hooks`` apart (``SavedTensor.unpack_hook``)."""
    saved_tensor = getattr(getattr(torch._C, "_autograd", None), "SavedTensor", None)
    return saved_tensor is None or hasattr(saved_tensor, "unpack_hook")


def _watch_saved_hooks(torch) -> None:
    """Note when the script enters ``saved_tensors_hooks`` (checkpointing, offloading), on torch that cannot see them."""
    hooks = getattr(getattr(torch.autograd, "graph", None), "saved_tensors_hooks", None)
    if hooks is None:
        return
    original = hooks.__enter__

    def entered(self):
        _probe["saved_hooks_entered"] = True
        return original(self)

    hooks.__enter__ = entered
    _probe["restore"] = (hooks, original)


def _after_step(optimizer, args, kwargs) -> None:
    probe = _probe
    try:
        torch, options = probe["torch"], probe["options"]
        probe["step_count"] += 1
        allocated, _ = _allocated(torch, _device_type(torch, options))
        if allocated is not None and len(probe["steps"]) < MAX_STEPS:
            probe["steps"].append(allocated)
        if probe["step_count"] == int(options.get("baseline_step", 1)):
            probe["baseline"] = _baseline(torch, options)
    except Exception as err:  # never break the learner's training loop
        probe["errors"].append(f"step hook: {type(err).__name__}: {err}")


def _baseline(torch, options: dict) -> dict:
    """Non-state bytes per root (by name without line) held right now, from the live stack."""
    frame = sys._getframe(1)
    script = options.get("script") or sys.argv[0]
    roots = roots_from_stack(frame, script)
    try:
        holders = find_holders(roots, device_type=_device_type(torch, options),
                               exclude=model_state_ids(list(roots.values())), cycles=False)
        baseline = {_stable(name): 0 for name in roots}
        baseline.update({_stable(h["name"]): _own(h) for h in holders})
        return baseline
    finally:
        roots.clear()
        del frame


def _hunt(torch, exc, script_globals) -> dict:
    options = _probe.get("options", {})
    device_type = _device_type(torch, options)
    script = options.get("script") or sys.argv[0]
    roots = roots_from(exc, script_globals, script)
    walk: dict = {}
    holders = find_holders(roots, device_type=device_type, exclude=model_state_ids(list(roots.values())),
                           skip={id(_probe), id(exc)}, report=walk)
    in_flight = set(roots.in_flight)
    roots.clear()
    allocated, reserved = _allocated(torch, device_type)
    result = summarize(
        holders,
        allocated=allocated,
        reserved=reserved,
        steps=_probe.get("steps"),
        baseline=_probe.get("baseline"),
        baseline_step=int(options.get("baseline_step", 1)),
        in_flight=in_flight,
        min_bytes=int(options.get("min_bytes", MIB)),
    )
    result.update(device_type=device_type, optimizer_steps=_probe.get("step_count", 0), walk=walk)
    if _probe.get("errors"):
        result["errors"] = list(_probe["errors"])
    return result


def finish(torch, out_dir: Path, exc: BaseException | None, script_globals: dict | None) -> None:
    """Walk what the script left (its failing frames, or its globals) and write ``out_dir/hunt.json``. Never raises."""
    try:
        result = _hunt(torch, exc, script_globals)
    except BaseException as err:  # noqa: BLE001 - the probe must never turn into the learner's error
        result = {"tool": TOOL, "kind": "error", "headline": f"the hunt failed: {type(err).__name__}: {err}",
                  "culprit_bytes": 0, "error": f"{type(err).__name__}: {err}", "holders": [], "steps": []}
    finally:
        restore = _probe.get("restore")
        if restore is not None:
            restore[0].__enter__ = restore[1]
            _probe["restore"] = None
        handle = _probe.get("handle")
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass
            _probe["handle"] = None
    try:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{TOOL}.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    except BaseException:  # noqa: BLE001 - nowhere left to report it
        pass


# --------------------------------------------------------------------------- parent side


def render(result: dict) -> list:
    """The holders as a table, the headline, and what it means."""
    from rich.table import Table
    from rich.text import Text

    out: list = []
    if result.get("error"):
        out.append(Text(f"hunt failed: {result['error']}", style="bold red"))
    table = Table(title="What holds device memory (each storage counted once)", title_justify="left")
    table.add_column("holder (what / where)", overflow="fold")
    table.add_column("MiB", justify="right")
    table.add_column("tensors", justify="right")
    table.add_column("graphs", justify="right")
    table.add_column("largest contributor", overflow="fold")
    table.add_column("note", overflow="fold")
    for h in result.get("holders", []):
        note = [h.get("label", "")]
        if h.get("graph_bytes"):
            note.append(f"{_mib(h['graph_bytes'])} saved by graphs")
        if h.get("state_bytes") and h.get("label") != STATE:
            note.append(f"{_mib(h['state_bytes'])} {STATE}")
        if h.get("grew_bytes"):
            note.append(f"grew {_mib(h['grew_bytes'])} since step {result.get('baseline_step')}")
        style = "bold red" if str(h.get("label", "")).startswith("culprit") else ("dim" if h.get("label") in (STATE, IN_FLIGHT) else "")
        table.add_row(
            h.get("what") or h["name"],
            f"{h['bytes'] / MIB:,.1f}",
            f"{h.get('tensors', 0)}" + (f" + {h['saved_tensors']} saved" if h.get("saved_tensors") else ""),
            str(h.get("graphs", 0)),
            h.get("largest_path", ""),
            "; ".join(n for n in note if n),
            style=style,
        )
    out.append(table)
    out.append(Text(result.get("headline", ""), style="bold"))
    allocated, explained = result.get("allocated_bytes"), result.get("explained_bytes")
    if allocated:
        line = f"The holders explain {_mib(explained or 0)} of the {_mib(allocated)} allocated ({100 * (explained or 0) / allocated:.0f}%)"
        rest = allocated - (explained or 0)
        if rest > MIB:
            line += f"; {_mib(rest)} is held by no Python name (temporaries inside the failing operation, or C++-only owners)"
        reserved = result.get("reserved_bytes")
        if reserved and reserved - allocated > MIB:
            line += f"; another {_mib(reserved - allocated)} is reserved by the allocator but allocated to nothing"
        out.append(Text(line + "."))
    packed = (result.get("walk") or {}).get("packed_saved")
    if packed:
        out.append(Text(
            f"{packed} values saved for backward were packed by saved_tensors_hooks (activation checkpointing or "
            "offloading) and were not read: reading them would run those hooks. Their bytes are not in the figures.",
            style="yellow",
        ))
    out.append(Text(result.get("advice") or ADVICE.get(result.get("kind", ""), ""), style="italic"))
    return out


def draw(result: dict, out_dir: Path) -> list[Path]:
    """``hunt.png``: allocated MiB after each optimizer step (culprit in the title), else the top holders."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    allocated, reserved = result.get("allocated_bytes"), result.get("reserved_bytes")
    culprit_bytes = result.get("culprit_bytes") or 0
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=100)
    steps = result.get("steps") or []
    if steps:
        xs = list(range(1, len(steps) + 1))
        ax.plot(xs, [s / MIB for s in steps], marker="o" if len(steps) <= 60 else None, label="allocated after the step")
        if allocated is not None:
            end = len(steps) + 1
            ax.scatter([end], [allocated / MIB], color="black", zorder=3, label="allocated when the script stopped")
            if culprit_bytes:
                # The culprit's share of the final figure, as a red bar ending at it.
                ax.bar([end], [culprit_bytes / MIB], bottom=[(allocated - culprit_bytes) / MIB], width=0.4,
                       color="tab:red", alpha=0.7, label=f"held by the culprit ({_mib(culprit_bytes)})")
        ax.set_xlabel("optimizer step (the last point: when the script stopped)")
        ax.set_ylabel("allocated (MiB)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right")
        title = "Allocated device memory after each optimizer step"
    else:
        top = list(result.get("holders", []))[:10][::-1]
        names = [textwrap.shorten(h.get("what") or h["name"], 60) for h in top]
        direct = [h.get("direct_bytes", 0) / MIB for h in top]
        graph = [h.get("graph_bytes", 0) / MIB for h in top]
        state = [h.get("state_bytes", 0) / MIB for h in top]
        ax.barh(names, direct, label="tensors held directly")
        ax.barh(names, graph, left=direct, label="saved by autograd graphs")
        ax.barh(names, state, left=[d + g for d, g in zip(direct, graph)], label=STATE, color="lightgrey")
        for value, text, style in ((allocated, "allocated", "-"), (reserved, "reserved", "--")):
            if value:
                ax.axvline(value / MIB, color="black", linestyle=style, linewidth=1, label=f"{text} ({_mib(value)})")
        ax.set_xlabel("held (MiB)")
        ax.legend(loc="lower right")
        title = "What holds device memory when the script stopped (each storage counted once)"
    ax.set_title("\n".join([title] + textwrap.wrap(result.get("headline", ""), 120)), fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / f"{TOOL}.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]
