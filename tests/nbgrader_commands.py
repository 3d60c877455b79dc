"""``nbgrader ARGS`` and ``oomlab nbgrader ARGS`` as an instructor types them, each command a process of its own,
without importing nbgrader each time.

Importing nbgrader's command line takes about 2 s, and nbformat's another 3 s (a grammar that jsonschema's IRI
format builds at import); the tests run more than a dozen of these commands. A server imports both once, then
forks a child per command: the child takes the command's folder, environment and output files, and runs
nbgrader's or oomlab's own ``main`` with the command's arguments (oomlab's imported in the child, whose console
reads the command's environment as it is made). Each command still
loads its configuration (the course's nbgrader_config.py and what it loads), runs and exits in a process of its
own, as from a shell; only the imports are shared. The server imports no torch and never starts CUDA, so a
command's own environment (``CUDA_VISIBLE_DEVICES``, say) decides what it sees.

The server starts with the first command's environment; a command whose Python path differs from it runs in
a fresh ``python -m nbgrader`` (or ``oomlab``) instead.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r"""
import atexit, json, os, sys, traceback
from nbgrader.apps.nbgraderapp import main as nbgrader_main
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            sys.argv = [request["program"], *request["args"]]
            if request["program"] == "oomlab":  # imported here: its console reads COLUMNS and the like when made
                from oomlab.cli import main as oomlab_main
            try:
                (oomlab_main if request["program"] == "oomlab" else nbgrader_main)()
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
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "pid": pid}), flush=True)
"""

_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "VIRTUAL_ENV")


class NbgraderCommands:
    """Run nbgrader commands from one server that imported nbgrader (one per test process, started at first use)."""

    def __init__(self) -> None:
        self.server: subprocess.Popen | None = None
        self.paths: tuple | None = None
        self.lock = threading.Lock()
        atexit.register(self.stop)

    def run(
        self, args: list[str], cwd: Path, env: dict, timeout: float = 600, program: str = "nbgrader"
    ) -> subprocess.CompletedProcess:
        """``program ARGS`` (``nbgrader`` or ``oomlab``) in ``cwd`` with ``env``, as from a shell."""
        paths = tuple(env.get(k) for k in _PATH_VARS)
        with self.lock:
            if self.server is None:
                self._start(env, paths)
            if paths != self.paths or self.server.poll() is not None:
                return subprocess.run(
                    [sys.executable, "-m", program, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
                )
            with tempfile.TemporaryDirectory(prefix="nbgrader-command-") as tmp:
                out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
                request = {"program": program, "args": list(args), "cwd": str(cwd), "env": dict(env)}
                request |= {"stdout": str(out), "stderr": str(err)}
                self.server.stdin.write(json.dumps(request) + "\n")
                self.server.stdin.flush()
                ready, _, _ = select.select([self.server.stdout], [], [], timeout)
                if not ready:
                    self.stop()
                    raise subprocess.TimeoutExpired([program, *args], timeout)
                reply = json.loads(self.server.stdout.readline())
                said = [p.read_text(encoding="utf-8", errors="replace") if p.exists() else "" for p in (out, err)]
            return subprocess.CompletedProcess([program, *args], reply["returncode"], *said)

    def _start(self, env: dict, paths: tuple) -> None:
        self.paths = paths
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a command that hangs is stopped with everything it started
        )
        if self.server.stdout.readline().strip() != "ready":
            self.stop()
            self.server = None
            raise RuntimeError("the nbgrader command server did not start")

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()


nbgrader_commands = NbgraderCommands()
