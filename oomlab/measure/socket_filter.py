"""Keep an estimator off the network: a seccomp filter that refuses every socket.

The estimator's Landlock sandbox (:mod:`oomlab.sizing.sandboxed`) hides every torch
it could read and leaves it a writable working folder. With a socket, an estimator
could download a torch into that folder within its time limit and simulate the step
instead of sizing it; with a socket to a local service, it could ask another process
to. An estimate is arithmetic on a config and needs no socket at all, so the estimator's
process refuses them all (and every process it starts: a filter is inherited and
survives ``exec``).

**Why seccomp and not Landlock.** Landlock's network rules (ABI 4, Linux 6.7) cover
only TCP's bind and connect; UDP, Unix sockets and raw sockets stay open. A seccomp
filter is a small BPF program the kernel runs at every system call (Linux 3.5 and newer,
unprivileged once ``no_new_privs`` is set, which the Landlock sandbox already sets). This
one answers ``EACCES`` to:

- ``socket`` and ``socketpair`` (every family: Internet, Unix, netlink, packet);
- ``io_uring_setup``: an io_uring can open a socket without calling ``socket``;
- any call made through another architecture's table (a 32-bit ``int 0x80`` on
  x86-64 has its own ``socketcall``) or x86-64's x32 numbering: a filter that
  checks numbers must first check which table they index.

Standard library only, like :mod:`oomlab.measure.sandbox`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

__all__ = ["REFUSED", "Unavailable", "apply", "program"]

# linux/audit.h, and each architecture's unistd.h: (the table's AUDIT_ARCH, {call: number})
_TABLES = {
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "io_uring_setup": 425}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "io_uring_setup": 425}),
}
REFUSED = ("socket", "socketpair", "io_uring_setup")
_X32_BIT = 0x40000000  # x86-64's x32 calls: the same AUDIT_ARCH, numbers with this bit set

# linux/filter.h, linux/seccomp.h
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


class Unavailable(Exception):
    """This machine cannot keep the estimator off the network; the message says why."""


def program(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` (``platform.machine()``): a list of BPF instructions ``(code, jt, jf, k)``."""
    machine = machine or platform.machine()
    if machine not in _TABLES:
        raise Unavailable(f"no socket filter is written for {machine} machines (only for {', '.join(_TABLES)})")
    arch, numbers = _TABLES[machine]
    refuse = _ERRNO | errno.EACCES
    prog = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, arch),  # this machine's own table: go on to the numbers
        (_RET_K, 0, 0, refuse),  # another table: every call refused
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE_K, 0, 1, _X32_BIT),
        (_RET_K, 0, 0, refuse),
    ]
    for i, name in enumerate(REFUSED):
        prog.append((_JEQ_K, len(REFUSED) - i, 0, numbers[name]))  # to the last instruction: refused
    prog += [(_RET_K, 0, 0, _ALLOW), (_RET_K, 0, 0, refuse)]
    return prog


def apply() -> None:
    """Refuse sockets to this process and every process it starts, for good. Raises :class:`Unavailable`."""
    prog = program()
    code = b"".join(struct.pack("=HBBI", *instruction) for instruction in prog)
    filters = ctypes.create_string_buffer(code, len(code))

    class _Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Program(len(prog), ctypes.addressof(filters))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise Unavailable(f"could not forbid new privileges: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise Unavailable(f"the kernel refused a seccomp filter: {os.strerror(ctypes.get_errno())}")
