"""Warm measuring servers, from the caller's side: start one, find one, ask it for a run.

A server (:mod:`oomlab.measure.server`) belongs to one course folder, one
allocator setting and one owner process. ``oomlab watch`` and ``oomlab dev
verify`` start them with :func:`serving`; ``oomlab check`` in another terminal
finds the one ``watch`` keeps through the file it writes under
``.oomlab/servers/``. :func:`for_run` answers which server, if any, may measure
a run, and why not when none may: the harness measures in a fresh process then,
and the result says so.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from oomlab.course.state import StateDir
from oomlab.measure import MEASURING_CODE, digest
from oomlab.measure.server import receive

SERVER = Path(__file__).with_name("server.py")
READY_TIMEOUT_S = 180  # importing torch on a cold disk can take a minute
REPLY_GRACE_S = 30  # beyond the run's own limit, which the server enforces


class Unavailable(Exception):
    """The server cannot take this run; the message says why, for the result's note."""


def code_digest() -> str:
    """The measuring code a server runs: a server started before an edit of it must not measure."""
    return digest(MEASURING_CODE)


def _key(alloc_conf: str) -> str:
    return hashlib.sha256(alloc_conf.encode()).hexdigest()[:12] if alloc_conf else "default"


def info_path(root: Path, alloc_conf: str) -> Path:
    """Where a course's server for one allocator setting says that it is ready, and how to reach it."""
    return StateDir(root).path / "servers" / f"{_key(alloc_conf)}.json"


def sockets_folder() -> Path:
    """Where the servers' sockets live: short (a socket's path may not exceed about 100 bytes) and private."""
    return Path(tempfile.gettempdir()) / f"oomlab-{os.getuid()}"


def socket_dir() -> Path:
    """:func:`sockets_folder`, made if missing, and refused unless private to this user."""
    folder = sockets_folder()
    folder.mkdir(mode=0o700, exist_ok=True)
    status = folder.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise Unavailable(f"{folder} is not private to this user")
    return folder


@dataclass
class WarmServer:
    """A running server: one this process started (``process`` set) or one it found."""

    root: Path
    alloc_conf: str
    socket: str
    info: Path
    process: subprocess.Popen | None = None
    log: Path | None = None
    started: float = field(default_factory=time.perf_counter)
    _ready: bool = False

    @classmethod
    def start(cls, root: Path, alloc_conf: str, env: dict) -> WarmServer:
        """Start a server in the background; :meth:`wait_ready` waits for its imports."""
        root = Path(root).resolve()
        info = info_path(root, alloc_conf)
        info.parent.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(f"{root}|{alloc_conf}|{os.getpid()}".encode()).hexdigest()[:16]
        sock = str(socket_dir() / f"{name}.sock")
        config = {"root": str(root), "alloc_conf": alloc_conf, "owner": os.getpid(), "socket": sock}
        config.update(info=str(info), code=code_digest())
        fd, config_path = tempfile.mkstemp(prefix="oomlab-server-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(config, f)
        log = info.with_suffix(".log")
        with open(log, "wb") as err:
            process = subprocess.Popen(
                [sys.executable, str(SERVER), config_path],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # Ctrl-C in the terminal reaches the owner, which stops it
            )
        server = cls(root, alloc_conf, sock, info, process, log)
        atexit.register(server.stop)
        return server

    @classmethod
    def find(cls, root: Path, alloc_conf: str) -> WarmServer | None:
        """The server another process keeps warm for this course and setting, if it can serve this process."""
        path = info_path(Path(root).resolve(), alloc_conf)
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            alive = info["pid"] > 0 and os.kill(info["pid"], 0) is None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not alive:
            return None
        same = (info.get("root"), info.get("alloc_conf"), info.get("code"), info.get("python"))
        if same != (str(Path(root).resolve()), alloc_conf, code_digest(), sys.executable):
            return None
        return cls(Path(root).resolve(), alloc_conf, info["socket"], path, _ready=True)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait until the server has imported torch and listens; False if it stopped or took too long."""
        if self._ready or self.process is None:
            return self._ready
        deadline = time.perf_counter() + timeout
        while self.process.poll() is None:
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.perf_counter()))
            if not ready:
                return False
            line = self.process.stdout.readline()
            if line.strip() == b"ready":
                self._ready = True
                self.process.stdout.close()
                return True
            if not line:  # the pipe closed: the process is ending
                self.process.wait()
        return False

    @property
    def is_ready(self) -> bool:
        """Ready now, without waiting."""
        return self.wait_ready(0) if not self._ready else True

    def why_not_ready(self) -> str:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] if self.log else []
            return f"the warm server stopped (exit code {self.process.returncode}{': ' + tail[0] if tail else ''})"
        return "the warm server is still importing torch"

    def request(self, request: dict) -> dict:
        """Send one run and wait for the server's answer; :class:`Unavailable` when it cannot be had."""
        request = {**request, "root": str(self.root), "code": code_digest()}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(self.socket)
                conn.sendall(json.dumps(request).encode() + b"\n")
                conn.settimeout(request["time_limit_s"] + REPLY_GRACE_S)
                reply = receive(conn)
        except EOFError:
            raise Unavailable("the warm server stopped during the run") from None
        except OSError as err:  # TimeoutError included
            raise Unavailable(f"the warm server could not be reached ({err.strerror or err})") from None
        if "refused" in reply:
            raise Unavailable(f"the warm server refused: {reply['refused']}")
        return reply

    def stop(self) -> None:
        """Stop a server this process started (one it only found belongs to another process)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for path in (self.socket, str(self.info)):
            with contextlib.suppress(OSError, ValueError):
                if path == str(self.info) and json.loads(Path(path).read_text(encoding="utf-8")).get("pid") != self.process.pid:
                    continue  # another server's by now
                os.unlink(path)
        with contextlib.suppress(OSError):
            if self.log and self.log.stat().st_size == 0:  # a log with something in it says why a server stopped
                self.log.unlink()
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)


# The servers this process started, by (course folder, allocator setting).
_started: dict[tuple[str, str], WarmServer] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def serving(root: Path, alloc_confs, env_of):
    """Keep one warm server per allocator setting for the course at ``root`` while the block runs.

    ``env_of(alloc_conf)`` gives the environment a run with that setting gets.
    The servers start in the background: runs before they are ready are
    measured in fresh processes, and say so.
    """
    root = Path(root).resolve()
    mine = []
    with _lock:
        for conf in dict.fromkeys(alloc_confs):
            if (str(root), conf) not in _started:
                _started[(str(root), conf)] = server = WarmServer.start(root, conf, env_of(conf))
                mine.append(((str(root), conf), server))
    try:
        yield [s for _, s in mine]
    finally:
        with _lock:
            for key, server in mine:
                _started.pop(key, None)
                server.stop()


_fresh_only = threading.Event()


@contextlib.contextmanager
def fresh_only():
    """While the block runs, every run of this process is measured in a fresh process, server or not."""
    _fresh_only.set()
    try:
        yield
    finally:
        _fresh_only.clear()


def for_run(root: Path | None, alloc_conf: str) -> tuple[WarmServer | None, str]:
    """The server that may measure a run of the course at ``root`` with ``alloc_conf``, or why none may.

    The reason is empty where no server runs for this course at all: a fresh
    process is then the normal way, with nothing to say.
    """
    if root is None or _fresh_only.is_set():
        return None, ""
    root = Path(root).resolve()
    with _lock:
        mine = {conf: s for (r, conf), s in _started.items() if r == str(root)}
    if alloc_conf in mine:
        server = mine[alloc_conf]
        return (server, "") if server.is_ready else (None, server.why_not_ready())
    if found := WarmServer.find(root, alloc_conf):
        return found, ""
    if mine or any(info_path(root, alloc_conf).parent.glob("*.json")):
        return None, f"the warm server runs with other allocator settings than this run's ({alloc_conf or 'none'})"
    return None, ""
