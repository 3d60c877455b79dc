"""Keep a course's warm measuring server between a learner's checks, and stop it once they stop checking.

A fresh run imports torch before the script's first line, which can take longer than the
script itself (``check_cold_s`` against ``check_kept_s`` in ``speed.json``). ``oomlab watch``
keeps a warm server (:mod:`oomlab.measure.warm`) while it runs; a learner who
checks by hand gets one from here: after a check or a run, :func:`keep_warm` starts a
*keeper* in the background (``python -m oomlab.measure.keeper ROOT SETTING``), a
small process that owns one server for the course and the exercise's allocator
setting. The next ``oomlab check`` (or ``run``) finds the server and forks its run from it, as
a second terminal does beside ``oomlab watch``; ``equivalence.json`` shows that a
forked run measures what a fresh one does.

The keeper holds a lock (``.oomlab/servers/KEY.keeper``, with its pid in it), so
one keeper serves a course and setting however many checks start at once. Every
check and run touches ``KEY.used``; the keeper stops, its server with it, once that is
:data:`IDLE_S` old, at ``oomlab stop`` (:func:`stop_keepers`), or when the server
itself stops.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

IDLE_S = 600.0  # a keeper stops after this long without a check: a learner away that long pays the imports once more
POLL_S = 1.0


def _files(root: Path, alloc_conf: str) -> tuple[Path, Path]:
    """The keeper's lock (its pid inside) and the stamp every check touches, beside the server's own info file."""
    from oomlab.measure.warm import info_path

    info = info_path(Path(root).resolve(), alloc_conf)
    return info.with_suffix(".keeper"), info.with_suffix(".used")


def _locked(path: Path) -> bool:
    """Whether a live keeper holds the lock at ``path`` (a pid read from it alone could name another process by now)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def keep_warm(root: Path, alloc_conf: str) -> bool:
    """Mark the course's server as used now; start a keeper if none runs. True when this call started one.

    The keeper gets this process's environment: its server serves runs whose environment is the same."""
    from oomlab.measure.warm import WarmServer, info_path

    lock, used = _files(root, alloc_conf)
    used.parent.mkdir(parents=True, exist_ok=True)
    used.touch()
    if WarmServer.find(root, alloc_conf) is not None:  # a keeper's, or `oomlab watch`'s, ready to serve this check
        return False
    if _locked(lock):
        if not info_path(Path(root).resolve(), alloc_conf).is_file():
            return False  # its server is still importing torch
        # Its server is ready but cannot serve: the measuring code or the Python changed since it started. Every
        # check would touch it and measure fresh beside it, so it is replaced.
        _stop(lock)
        deadline = time.monotonic() + 10
        while _locked(lock) and time.monotonic() < deadline:
            time.sleep(0.05)
    subprocess.Popen(
        [sys.executable, "-m", "oomlab.measure.keeper", str(Path(root).resolve()), alloc_conf],
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives the check that started it, and no Ctrl-C in its terminal reaches it
    )
    return True


def _live_locks(root: Path) -> list[Path]:
    """The locks of the keepers running for the course at ``root``."""
    from oomlab.measure.warm import info_path

    return [lock for lock in sorted(info_path(Path(root).resolve(), "").parent.glob("*.keeper")) if _locked(lock)]


def stop_keepers(root: Path) -> int:
    """Stop every keeper of the course at ``root`` (and so its server); how many were running."""
    return sum(_stop(lock) for lock in _live_locks(root))


def kept(root: Path) -> list[dict]:
    """The keepers running for the course at ``root``: each one's allocator settings (None while its server still
    imports torch) and how long since a check or run last used it, in seconds."""
    import json

    found = []
    for lock in _live_locks(root):
        try:
            settings = json.loads(lock.with_suffix(".json").read_text(encoding="utf-8"))["alloc_conf"]
        except (OSError, ValueError, KeyError, TypeError):
            settings = None
        try:
            idle = max(0.0, time.time() - lock.with_suffix(".used").stat().st_mtime)
        except OSError:
            idle = None
        found.append({"alloc_conf": settings, "idle_s": idle})
    return found


def _stop(lock: Path) -> bool:
    """Ask the keeper holding ``lock`` to stop (it stops its server first); whether it could be asked."""
    try:
        os.kill(int(lock.read_text(encoding="ascii").strip()), signal.SIGTERM)
    except (OSError, ValueError):
        return False
    return True


def main(root: str, alloc_conf: str, idle_s: float = IDLE_S) -> int:
    from oomlab.measure import warm
    from oomlab.measure.harness import child_env

    lock_path, used = _files(Path(root), alloc_conf)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another check started a keeper a moment earlier: it serves
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))

    def idle() -> float:
        try:
            return time.time() - used.stat().st_mtime
        except OSError:
            return idle_s  # the stamp is gone (the course's .oomlab was removed): nobody checks here any more

    with warm.serving(Path(root), [alloc_conf], child_env) as servers:
        server = servers[0]
        while not stopping and idle() < idle_s and server.process.poll() is None:
            time.sleep(POLL_S)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4])))
