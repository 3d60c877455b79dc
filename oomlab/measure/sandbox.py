"""Keep a graded script away from the answers: a Landlock sandbox for the measured process.

While ``oomlab check`` or a class's grading measures a learner's script, the
script must not read the reference fix (``solutions/``, the package's copy),
the cached reference measurement (``.oomlab/``), the course's own history
(``.git``) or the harness's files (its spec, its result), nor write anywhere
that the grading reads later. An in-process guard can always be undone from
inside; the kernel's cannot.

**Why Landlock.** It is a Linux security module (5.13 and newer, enabled by
default on current Debian, Ubuntu and Fedora kernels) that lets an
*unprivileged* process take away its own file-system rights, irrevocably, for
itself and every process it starts. It needs no root, no user namespace and no
mount: the same code works for a learner on a laptop and as root on a GPU
server (a root process is restricted the same way). A mount namespace needs
root or unprivileged user namespaces (refused in many containers and by
AppArmor on Ubuntu 24.04); another user needs root and leaves world-readable
files readable.

**The policy** (:class:`Policy`) names three kinds of folders: ``hidden`` (no
reading or writing at all), ``visible`` (readable again inside a hidden one:
the script's own folder, the Python installation, the ``oomlab`` package) and
``writable`` (the run's private working folder, ``/dev``). For any path the
deepest entry that holds it decides; a path under no entry stays readable.
Landlock only *grants*, beneath a folder, so :func:`grants` turns the policy
into rules by walking down to each hidden entry and granting its siblings one
by one. Listing folders (``READ_DIR``) stays allowed everywhere: Python's
import system lists every folder on ``sys.path``, and a name reveals nothing
the course does not publish.

What it cannot do: a file created after the rules were made, in a folder that
holds a hidden entry, is not readable (nothing of the learner's lives there);
a descriptor the process already holds stays usable (the measuring child
opens its result and weights files before it restricts itself, and the
parent never trusts what arrives on them alone: see :mod:`oomlab.measure.witness`).

Standard library only: the measuring child applies it before importing torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Policy", "Unavailable", "abi_version", "apply", "availability", "grants"]

# linux/landlock.h
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every 64-bit architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: renaming or linking across folders
TRUNCATE = 1 << 14  # ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6: no connecting to abstract sockets made outside the sandbox
SCOPE_SIGNAL = 1 << 1  # ABI 6: no signals to processes outside the sandbox (the parent that measures it)

READ = READ_FILE | EXECUTE
WRITE = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # the only rights a rule on a file (not a folder) may hold
# ioctl on devices (ABI 5) and TCP (ABI 4) are left unhandled, so allowed: CUDA drives the GPU through
# ioctl on /dev/nvidia*, and a distributed job talks TCP.

HIDE, SHOW, WRITABLE = "hidden", "visible", "writable"


class Unavailable(Exception):
    """This kernel cannot sandbox the run; the message says why, in a sentence a user can act on."""


@dataclass(frozen=True)
class Policy:
    """What the measured process may read and write: the deepest entry holding a path decides."""

    hidden: tuple[str, ...] = ()
    visible: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    entries: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        entries = {}
        for kind, paths in ((SHOW, self.visible), (WRITABLE, self.writable), (HIDE, self.hidden)):
            for path in paths:
                entries[os.path.normpath(os.path.abspath(path))] = kind  # hidden wins over a visible twin
        object.__setattr__(self, "entries", entries)

    def to_json(self) -> dict:
        return {"hidden": list(self.hidden), "visible": list(self.visible), "writable": list(self.writable)}

    @classmethod
    def from_json(cls, data: dict) -> Policy:
        return cls(tuple(data.get("hidden", ())), tuple(data.get("visible", ())), tuple(data.get("writable", ())))

    def kind_of(self, path: str) -> str:
        """The access ``path`` gets: ``hidden``, ``visible`` (read only) or ``writable``."""
        path = os.path.normpath(os.path.abspath(path))
        best, kind = -1, SHOW
        for entry, entry_kind in self.entries.items():
            if _within(path, entry) and len(entry) > best:
                best, kind = len(entry), entry_kind
        return kind


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _children(folder: str) -> list[tuple[str, bool]]:
    """(path, is a folder) for each entry of ``folder``; symbolic links are skipped (their targets have rules of their own)."""
    try:
        with os.scandir(folder) as it:
            return [(e.path, e.is_dir(follow_symlinks=False)) for e in it if not e.is_symlink()]
    except OSError:
        return []


RIGHTS = {SHOW: READ, WRITABLE: READ | WRITE}


def grants(policy: Policy, children: Callable[[str], Iterable[tuple[str, bool]]] = _children) -> list[tuple[str, int, bool]]:
    """The Landlock rules that give ``policy``: (path, rights, is a folder), fewest first from the root.

    A folder with no entry below it is granted whole, with the rights of the
    deepest entry above it; a folder with entries below is split into its
    children. ``children`` lists a folder (tests pass a fake file system).
    """
    rules: list[tuple[str, int, bool]] = []
    entries = policy.entries

    def visit(path: str, inherited: str, is_dir: bool) -> None:
        kind = entries.get(path, inherited)
        below = is_dir and any(e != path and _within(e, path) for e in entries)
        if not below:
            if kind != HIDE:
                rights = RIGHTS[kind] | (TRUNCATE if kind == WRITABLE else 0)
                rules.append((path, rights if is_dir else rights & FILE_RIGHTS, is_dir))
            return
        for child, child_is_dir in sorted(children(path)):
            visit(child, kind, child_is_dir)

    visit(os.sep, SHOW, True)
    return rules


def availability() -> tuple[int, str]:
    """(Landlock ABI version, "") where this kernel can sandbox, else (0, why not)."""
    if platform.system() != "Linux":
        return 0, f"Landlock is a Linux feature; this is {platform.system()}"
    if platform.architecture()[0] != "64bit":
        return 0, "the sandbox supports 64-bit Linux only"
    version = abi_version()
    if version > 0:
        return version, ""
    code = -version
    if code == errno.ENOSYS:
        return 0, f"this kernel ({platform.release()}) has no Landlock (Linux 5.13 or newer is needed)"
    if code == errno.EOPNOTSUPP:
        return (
            0,
            f"Landlock is built into this kernel ({platform.release()}) but not enabled (add landlock to the lsm= boot parameter)",
        )
    return 0, f"Landlock cannot be used here: {os.strerror(code)}"


def abi_version() -> int:
    """The kernel's Landlock ABI version, or minus the errno of the refusal."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(version) if version >= 0 else -ctypes.get_errno()


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def apply(policy: Policy) -> int:
    """Restrict this process, and everything it starts, to ``policy``, for good; returns the ABI version used.

    Must run while the process has one thread: Landlock restricts the calling
    thread and the threads and processes it starts, never threads already
    running (the measuring child applies it before CUDA or torch start any).
    Raises :class:`Unavailable` where the kernel cannot.
    """
    abi, why = availability()
    if not abi:
        raise Unavailable(why)
    if _threads() != 1:
        raise Unavailable(f"the process already runs {_threads()} threads; a sandbox applied now would leave them outside")
    handled = READ | READ_DIR | WRITE | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    attr = _RulesetAttr(handled, 0, (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)  # an older kernel knows a shorter structure
    ruleset = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise Unavailable(f"Landlock refused a ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        rules = [(os.sep, READ_DIR, True)]  # listing folders stays allowed everywhere (see the module's docstring)
        rules += grants(policy)
        for path, rights, is_dir in rules:
            rights &= handled
            if abi >= 2 and is_dir and rights & WRITE_FILE:
                rights |= REFER
            _add_rule(libc, ruleset, path, rights)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise Unavailable(f"could not forbid new privileges: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise Unavailable(f"Landlock refused to restrict the process: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


def _add_rule(libc, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone since it was listed: nothing to grant
    try:
        beneath = _PathBeneath(rights, fd)
        if (
            libc.syscall(
                ctypes.c_long(_SYS_ADD_RULE),
                ctypes.c_int(ruleset),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(beneath),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            code = ctypes.get_errno()
            if code != errno.EINVAL:  # EINVAL: a special file that takes no rule; it stays unreadable
                raise Unavailable(f"Landlock refused a rule for {path}: {os.strerror(code)}")
    finally:
        os.close(fd)
