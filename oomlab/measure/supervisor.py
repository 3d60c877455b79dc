"""The trusted supervisor of one measured run: start the child, watch it from outside, say what the witnesses saw.

Usage: ``python supervisor.py CONFIG.json`` (started by :mod:`oomlab.measure.harness`
for a run in a fresh process; a warm server's per-run fork does the same
through :func:`supervise`). The config names the command of the measured
child, its folder, environment and output files, the time limit, and where
to write the report. This process never runs the learner's code, so the
script cannot change what it reports: the child's exit, the time limit, and
what :class:`oomlab.measure.witness.Witness` saw of the driver and the kernel.

The child gets one end of a socket pair (its descriptor number in the
environment variable :data:`MARKS_FD`) to mark the moments the witness reads
the driver at.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

if __name__ == "__main__":  # run as a file: make the oomlab package importable
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oomlab.measure.witness import Witness  # noqa: E402 - after the path above

MARKS_FD = "OOMLAB_MARKS_FD"


def supervise(spawn, time_limit_s: float, caller=None, driver=None) -> dict:
    """Start the child with ``spawn(marks_fd) -> pid`` and watch it to its end; the witness's report.

    ``spawn`` is called with the child's end of the marking socket, which it
    must leave open in the child and nowhere else.
    """
    mine, theirs = socket.socketpair()
    try:
        pid = spawn(theirs.fileno())
    finally:
        theirs.close()
    try:
        return Witness(pid, mine, time.perf_counter() + time_limit_s, caller=caller, driver=driver).run()
    finally:
        mine.close()


MARKS_IN_CHILD = 3  # the descriptor the measured child finds the marking socket at


def fork_child(stdout: str, stderr: str, marks_fd: int, cwd: str) -> int:
    """Fork the measured child; in the child, 0 and in the parent its pid.

    The child gets a session of its own (so that the time limit stops everything
    the script starts), its output files, no input, the marking socket at
    :data:`MARKS_IN_CHILD` and no other descriptor of this process: not the warm
    server's connection to its caller, on which a script could answer.
    """
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid:
        for fd in (out, err, null):
            os.close(fd)
        return pid
    try:
        os.setsid()
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(marks_fd, MARKS_IN_CHILD)
        os.closerange(MARKS_IN_CHILD + 1, 65536)
        os.chdir(cwd)
    except BaseException:
        os._exit(127)  # never go on as a copy of the supervisor
    return 0


def spawn_fresh(config: dict):
    """The ``spawn`` of a fresh run: fork the child and exec a new interpreter in it."""

    def spawn(marks_fd: int) -> int:
        pid = fork_child(config["stdout"], config["stderr"], marks_fd, config["cwd"])
        if pid:
            return pid
        try:
            env = {**config["env"], MARKS_FD: str(MARKS_IN_CHILD)}
            os.execve(config["command"][0], config["command"], env)
        finally:
            os._exit(127)  # exec failed

    return spawn


def main(config_path: str) -> int:
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    report = supervise(spawn_fresh(config), config["time_limit_s"], driver=None if config.get("driver", True) else False)
    tmp = config["report"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace(tmp, config["report"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
