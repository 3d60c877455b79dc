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
  the measured child in its own session, enforces the time limit, kills the
  session when the limit passes or the caller goes away, and answers with the
  exit status: the caller then reads the child's result as it reads a fresh one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
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
    from oomlab.measure import child

    loaded = child.preload()
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
    """Serve one request: check it is ours, run the measured child to its end or its limit, answer."""
    request = receive(conn)
    if request.get("root") != config["root"]:
        return answer(conn, {"refused": f"this server measures the course in {config['root']}, not {request.get('root')}"})
    if request.get("code") != config["code"]:
        return answer(conn, {"refused": "the measuring code changed since this server started"})
    if changed := differences(config["started_with"], request["env"]):
        return answer(conn, {"refused": f"the environment differs from the server's in {', '.join(changed)}"})

    start = time.perf_counter()
    pid = fork_measured({**request, "env": {**request["env"], **config["set_by_imports"]}})
    timed_out, status = wait(pid, conn, start + request["time_limit_s"])
    if status is None:  # still running: past its limit, or the caller went away
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    answer(
        conn,
        {"returncode": os.waitstatus_to_exitcode(status), "timed_out": bool(timed_out), "process_s": time.perf_counter() - start},
    )


def fork_measured(request: dict) -> int:
    """Fork the measured child: a session of its own, the caller's files and environment, then ``child.main``."""
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid:
        for fd in (out, err, null):
            os.close(fd)
        return pid
    code = 1
    try:
        os.setsid()  # so that the time limit stops everything the script starts
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from oomlab.measure import child

        code = child.main(request["spec"])
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


def wait(pid: int, conn: socket.socket, deadline: float) -> tuple[bool | None, int | None]:
    """Wait for the child to end, its deadline to pass, or the caller to go; (timed out, wait status or None)."""
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return False, status
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return True, None
            watched = [conn] if pidfd is None else [conn, pidfd]
            ready, _, _ = select.select(watched, [], [], remaining if pidfd is not None else min(remaining, 0.01))
            if conn in ready and not conn.recv(1, socket.MSG_PEEK):
                return None, None  # the caller is gone: nobody wants this result
    finally:
        if pidfd is not None:
            os.close(pidfd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
