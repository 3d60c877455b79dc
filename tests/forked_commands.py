"""``nbgrader ARGS`` and ``oomlab ARGS`` as a user types them, each command a process of its own, without a fresh
Python importing the same modules for every one.

The tests run well over a hundred of these commands. Importing nbgrader's command line takes about 2 s, and
nbformat's another 3 s (a grammar that jsonschema's IRI format builds at import); a fresh ``python -m oomlab``
spends a quarter of a second starting Python and importing typer, rich and the course before its first line of
work. A server imports those once, then forks a child per command: the child takes the command's folder,
environment and output files, and runs nbgrader's or oomlab's own ``main`` with the command's arguments. Each
command still reads its configuration and its environment, runs and exits in a process of its own, as from a
shell; only the imports are shared. oomlab's command line itself is imported in the child, since its console
reads ``COLUMNS`` and the like as it is made; the server imports no torch and never starts CUDA, so a command's
own environment (``CUDA_VISIBLE_DEVICES``, say) decides what it sees.

Commands from several threads run at once, each in its own child. A server starts with the first command's
environment; a command whose Python path differs from it runs in a fresh ``python -m PROGRAM`` instead.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r"""
import atexit, json, os, select, sys, traceback
{preload}
print("ready", flush=True)
running = {{}}  # child pid -> request id


def child(request):
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.argv = [request["program"], *request["args"]]
        if request["program"] == "oomlab":
            from oomlab.cli import main
        else:
            from nbgrader.apps.nbgraderapp import main
        try:
            main()
            code = 0
        except SystemExit as done:  # as the interpreter ends on it: a message is printed, and the code is 1
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, int) and done.code is not None:
                print(done.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


stdin_open, pending = True, b""
while stdin_open or running:
    if stdin_open and select.select([0], [], [], 0.02)[0]:
        chunk = os.read(0, 1 << 16)  # not sys.stdin: its buffer could hold a request that select no longer sees
        stdin_open = bool(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request)
            running[pid] = request["id"]
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        done = {{"id": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)}}
        print(json.dumps(done), flush=True)
    if not stdin_open and running:
        select.select([], [], [], 0.02)
"""

_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "VIRTUAL_ENV")


class ForkedCommands:
    """Run commands from one server that imported ``preload`` (one per test process, started at first use)."""

    def __init__(self, preload: str) -> None:
        self.preload = preload
        self.server: subprocess.Popen | None = None
        self.paths: tuple | None = None
        self.lock = threading.Lock()
        self.replies: dict[int, dict] = {}
        self.arrived = threading.Condition(self.lock)
        self.ids = itertools.count()
        atexit.register(self.stop)

    def run(
        self, args: list[str], cwd: Path, env: dict, timeout: float = 600, program: str = "nbgrader"
    ) -> subprocess.CompletedProcess:
        """``program ARGS`` (``nbgrader`` or ``oomlab``) in ``cwd`` with ``env``, as from a shell."""
        paths = tuple(env.get(k) for k in _PATH_VARS)
        with self.lock:
            if self.server is None:
                self._start(env, paths)
            forked = paths == self.paths and self.server.poll() is None
        if not forked:
            return subprocess.run(
                [sys.executable, "-m", program, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
            )
        with tempfile.TemporaryDirectory(prefix="forked-command-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            with self.lock:
                request_id = next(self.ids)
                request = {"id": request_id, "program": program, "args": list(args), "cwd": str(cwd), "env": dict(env)}
                self.server.stdin.write(json.dumps(request | {"stdout": str(out), "stderr": str(err)}) + "\n")
                self.server.stdin.flush()
                if not self.arrived.wait_for(lambda: request_id in self.replies or self.server.poll() is not None, timeout):
                    self.stop()
                    raise subprocess.TimeoutExpired([program, *args], timeout)
                if request_id not in self.replies:
                    raise RuntimeError(f"the command server stopped during `{program} {' '.join(args)}`")
                reply = self.replies.pop(request_id)
            said = [p.read_text(encoding="utf-8", errors="replace") if p.exists() else "" for p in (out, err)]
        return subprocess.CompletedProcess([program, *args], reply["returncode"], *said)

    def _start(self, env: dict, paths: tuple) -> None:
        self.paths = paths
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER.format(preload=self.preload)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a command that hangs is stopped with everything it started
        )
        if self.server.stdout.readline().strip() != "ready":
            self.stop()
            self.server = None
            raise RuntimeError("the command server did not start")
        threading.Thread(target=self._read_replies, args=(self.server,), daemon=True).start()

    def _read_replies(self, server: subprocess.Popen) -> None:
        for line in server.stdout:
            reply = json.loads(line)
            with self.lock:
                self.replies[reply["id"]] = reply
                self.arrived.notify_all()
        with self.lock:
            self.arrived.notify_all()  # the server ended: no reply will come

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()


# nbgrader's command line, and with it nbformat and nbgrader's API, which `oomlab nbgrader` uses too.
nbgrader_commands = ForkedCommands("import nbgrader.apps.nbgraderapp")
# What `oomlab` imports before its first line of work, all but its command line (whose console reads the environment).
oomlab_commands = ForkedCommands(
    "import typer, rich.console, rich.syntax, oomlab.course, oomlab.tools.run, oomlab.grading.verdict"
)
