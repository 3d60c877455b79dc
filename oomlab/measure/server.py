"""The warm measuring server: torch imported once, a fresh forked child per measurement.

Usage: ``python server.py CONFIG.json`` (started by :mod:`oomlab.measure.warm`,
never by hand). Of a fresh run's seven seconds, the workload is well under
one: ``import torch`` and the ``torch._dynamo`` that the first optimizer step
pulls in take the rest. This process pays for them once and never touches
CUDA, so each forked child starts the way a fresh process does: CUDA not
initialised, the caching allocator empty, the budget and guards of
``child.py`` set before the learner's code runs.

Why each rule holds:

- **CUDA stays untouched here.** A process that has initialised CUDA cannot
  fork a child that uses it. Nothing here calls ``torch.cuda``; even
  ``is_available()`` would initialise the driver.
- **Allocator settings are fixed at start.** ``PYTORCH_CUDA_ALLOC_CONF`` may be
  read when torch is imported, so a server serves one setting, the one in its
  environment; a run with another setting is measured in a fresh process by the
  caller, which says so in the result.
- **One course, one owner.** A request names its course folder, the measuring
  code's digest and the environment variables torch reads at import; a server
  refuses any that differ from its own. It stops within a second of its owner
  (``oomlab watch``, ``oomlab dev verify``) ending, however that ends.
- **Each run is supervised.** Per connection a supervisor is forked, which forks
  the measured child in its own session, enforces the time limit, watches the
  driver and the kernel (:mod:`oomlab.measure.witness`), kills everything the
  run started when the limit passes or the caller goes away, and answers with
  the witness's report: the caller then reads the child's result as it reads a
  fresh one.
- **Only its owners may ask.** The socket is private to this user, and a
  connection from a process that descends from this server (a measured script,
  or anything it started) is refused: a script must not have runs measured
  outside its sandbox.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback

if __name__ == "__main__":  # run as a file: make the oomlab package importable
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Environment variables whose value a process fixes when it starts or imports torch: a request
# whose environment differs from the server's in one of them cannot be served by a fork.
FIXED_AT_START = ("PYTORCH_", "TORCH", "CUDA_", "CUBLAS", "CUDNN", "NCCL_", "OMP_", "MKL_", "PYTHON", "LD_")
OWNER_POLL_S = 1.0


def fixed_at_start(env: dict) -> dict:
    """The variables of ``env`` that a forked child inherits from the server and cannot change."""
    return {k: v for k, v in env.items() if k.startswith(FIXED_AT_START)}


def differences(mine: dict, theirs: dict) -> list[str]:
    """Names of the variables fixed at start whose values differ between two environments."""
    a, b = fixed_at_start(mine), fixed_at_start(theirs)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def main(config_path: str) -> int:
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    os.unlink(config_path)
    started_with = dict(os.environ)
    from oomlab.measure import child, witness

    loaded = child.preload()
    with contextlib.suppress(ImportError):  # each run's supervisor reads the driver through it
        import pynvml  # noqa: F401
    # What the imports set (torch._dynamo sets TORCHINDUCTOR_CACHE_DIR): a fresh run's imports would set it too.
    config["started_with"] = started_with
    config["set_by_imports"] = {k: v for k, v in os.environ.items() if started_with.get(k) != v}
    import torch

    path = config["socket"]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    listener.settimeout(OWNER_POLL_S)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    info = {
        "pid": os.getpid(),
        "owner": config["owner"],
        "root": config["root"],
        "alloc_conf": config["alloc_conf"],
        "code": config["code"],
        "python": sys.executable,
        "torch": torch.__version__,
        "socket": path,
        "preloaded": loaded,
        "started": time.time(),
    }
    tmp = config["info"] + f".{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(info, f)
    os.replace(tmp, config["info"])
    print("ready", flush=True)  # the owner waits for this line
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nobody reads the pipe any more
    os.close(null)

    try:
        while not stopping and os.getppid() == config["owner"]:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                reap()
                continue
            except InterruptedError:
                continue
            if refused := stranger(conn, witness):
                answer(conn, {"refused": refused})
                conn.close()
                continue
            if os.fork() == 0:  # the supervisor of this one run
                listener.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                code = 1
                try:
                    conn.settimeout(None)
                    supervise(conn, config)
                    code = 0
                finally:
                    os._exit(code)
            conn.close()
            reap()
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with contextlib.suppress(OSError, ValueError), open(config["info"], encoding="utf-8") as f:
            if json.load(f).get("pid") == os.getpid():  # remove the info file only if it is still ours
                os.unlink(config["info"])
    return 0


def stranger(conn: socket.socket, witness) -> str:
    """Why a connection may not ask for a run ("" when it may): another user, or a process this server measures."""
    try:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError as err:
        return f"the caller cannot be identified ({err.strerror or err})"
    if uid != os.getuid():
        return "the caller is another user"
    if witness.descends(pid, os.getpid()):
        return "the caller is a run this server measures: a measured script may not ask for runs"
    return ""


def reap() -> None:
    """Collect the supervisors that have finished, so none lingers as a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def receive(conn: socket.socket) -> dict:
    """One JSON line from ``conn``, a request or a reply; :class:`EOFError` when the other side closes first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise EOFError("the connection closed before a whole message came")
        data += chunk
    return json.loads(data)


def answer(conn: socket.socket, reply: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(reply).encode() + b"\n")


def supervise(conn: socket.socket, config: dict) -> None:
    """Serve one request: check it is ours, run the measured child to its end or its limit under a witness, answer."""
    from oomlab.measure.supervisor import supervise as watch

    request = receive(conn)
    if request.get("root") != config["root"]:
        return answer(conn, {"refused": f"this server measures the course in {config['root']}, not {request.get('root')}"})
    if request.get("code") != config["code"]:
        return answer(conn, {"refused": "the measuring code changed since this server started"})
    if changed := differences(config["started_with"], request["env"]):
        return answer(conn, {"refused": f"the environment differs from the server's in {', '.join(changed)}"})
    request = {**request, "env": {**request["env"], **config["set_by_imports"]}}

    def spawn(marks_fd: int) -> int:
        return fork_measured(request, marks_fd)

    driver = None if request.get("driver", True) else False  # None: the witness reads the driver; False: it does not
    answer(conn, watch(spawn, request["time_limit_s"], caller=conn, driver=driver))


def fork_measured(request: dict, marks_fd: int) -> int:
    """Fork the measured child (:func:`oomlab.measure.supervisor.fork_child`), then run ``child.main`` in it with the caller's environment."""
    from oomlab.measure.supervisor import MARKS_IN_CHILD, fork_child

    pid = fork_child(request["stdout"], request["stderr"], marks_fd, request["cwd"])
    if pid:
        return pid
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        from oomlab.measure import child

        code = child.main(request["spec"], socket.socket(fileno=MARKS_IN_CHILD))
        # What a fresh interpreter does at its end: wait for the script's threads, run what it registered.
        threading._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
