"""The driver and the kernel as witnesses of a measured run, from a process the script cannot touch.

Everything the measuring child reports about itself (the allocator's figures,
the workload, the weights) comes out of the process that ran the learner's
script, and a script can rewrite anything in its own process. What the driver
and the kernel say about that process it cannot change. So the *supervisor*
of each run (the fresh run's :mod:`oomlab.measure.supervisor`, or the warm
server's per-run fork) starts the measured child and, until the child and
everything it started have ended, watches:

- **the driver** (NVML): every few milliseconds (:data:`INTERVAL_S`), the GPU
  memory of every process on every GPU. The child's own figure gives the
  peak the grader compares with the allocator's reserved peak plus the CUDA
  context; any other process that descends from the run is reported
  (a job moved into a subprocess, out of the budget's reach);
- **the kernel**: the child's CPU time and that of every process it started
  (``wait4``'s resource usage; the supervisor is a *child subreaper*, so even a
  process the script orphans is reaped here), and the child's anonymous
  resident memory on the host (``RssAnon``: tensors, caches, buffers; not the
  libraries' code, whose pages grow with the kernels a run happens to load),
  at every sample, against their values when the script began.

The child marks two moments on a socket it shares with the supervisor:
``R`` (ready: CUDA and the budget are set up, the script is about to start;
nothing of the script has run, so the moment can be trusted) and ``F`` (the
figures have just been read). At each the supervisor reads the driver at
once; at ``F`` it answers ``A`` so the child goes on only after the reading.

What a sample can miss: memory taken and given back between two samples. The
caching allocator keeps what it reserves until the script empties its cache
or a cache flush retries an allocation, so a reserved peak lasts; memory taken
around the allocator for less than the interval is not seen. The interval and
each sample's cost are in the report.

Standard library only; ``pynvml`` (nvidia-ml-py) is imported when watching starts.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
import time

from oomlab.measure.nvml import INSTALL, memory_by_process

__all__ = ["INTERVAL_S", "MARK_FIGURES", "MARK_READY", "Driver", "Witness", "descends", "mark"]

INTERVAL_S = 0.005
MARK_READY, MARK_FIGURES, ACK = b"R", b"F", b"A"
_PR_SET_CHILD_SUBREAPER = 36
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def mark(sock: socket.socket | None, what: bytes, wait_s: float = 10.0) -> bool:
    """The child's side: mark a moment; for :data:`MARK_FIGURES`, wait until the supervisor has read the driver."""
    if sock is None:
        return False
    try:
        sock.sendall(what)
        if what == MARK_FIGURES:
            sock.settimeout(wait_s)
            return sock.recv(1) == ACK
        return True
    except OSError:
        return False


# -- processes, as /proc shows them ---------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode().split()


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def started(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: with the pid, names a process even after pids wrap."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of a running process, its threads included, its children not."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / _TICK if fields else None


def rss_bytes(pid: int) -> int | None:
    """The process's anonymous resident memory (``RssAnon``): what it allocated, not the files it maps."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def command(pid: int, limit: int = 200) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:limit]
    except OSError:
        return "?"


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (every thread's list: a child belongs to the thread that forked it)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
            found += [int(x) for x in f.read().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, breadth first."""
    found, queue = [], [pid]
    while queue:
        for child in children(queue.pop(0)):
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def descends(pid: int, ancestor: int, limit: int = 256) -> bool:
    """Whether ``pid`` is ``ancestor`` or below it, by its chain of parents."""
    for _ in range(limit):
        if pid == ancestor:
            return True
        if pid is None or pid <= 1:
            return False
        pid = parent_of(pid)
    return False


# -- the driver ------------------------------------------------------------------------------------------------------


class Driver:
    """NVML's per-process GPU memory, every GPU at once; ``reason`` says why there is none."""

    def __init__(self, nvml=None):
        self.nvml, self.handles, self.reason = nvml, [], ""
        self.calls, self.call_s, self.max_call_s = 0, 0.0, 0.0

    def start(self) -> bool:
        if self.nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                self.reason = f"NVML's Python bindings are not installed ({INSTALL})"
                return False
            self.nvml = nvml
        try:
            self.nvml.nvmlInit()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]
        except Exception as err:  # noqa: BLE001 - NVMLError, or a library that cannot be loaded
            self.reason = f"NVML could not start: {type(err).__name__}: {err}"
            return False
        return True

    def sample(self) -> dict[int, int | None]:
        """pid -> bytes on the GPUs (summed over them; None where the driver does not say)."""
        start = time.perf_counter()
        used = memory_by_process(self.nvml, *self.handles)
        spent = time.perf_counter() - start
        self.calls += 1
        self.call_s += spent
        self.max_call_s = max(self.max_call_s, spent)
        return used

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


# -- the supervisor's watch ------------------------------------------------------------------------------------------


class Witness:
    """Watch one measured child and everything it starts until they have all ended; :meth:`run` gives the report.

    ``marks`` is the supervisor's end of the socket the child marks moments on;
    ``caller`` a connection whose closing means nobody wants the result any more
    (the warm server's client); ``driver`` a :class:`Driver` (tests give one with
    a fake NVML, or ``False`` for none). The calling process must be the child's
    parent; it becomes a child subreaper, so every orphan of the run is its own.
    """

    def __init__(self, child: int, marks: socket.socket | None, deadline: float, caller=None, driver=None, interval_s=INTERVAL_S):
        self.child, self.marks, self.deadline, self.caller = child, marks, deadline, caller
        self.driver = Driver() if driver is None else driver
        self.interval_s = interval_s
        self.me = os.getpid()
        self.start = time.perf_counter()
        self.driver_ok = False
        self.samples = 0
        self.last_read_s = 0.0
        self.peak: int | None = None
        self.peak_t: float | None = None
        self.at = {}  # "ready" / "figures" -> {"t", "driver", "cpu_s", "rss_bytes"}
        self.others: dict[int, dict] = {}  # pid -> {"command", "used_bytes"}: processes of the run on a GPU
        self.strangers: set[tuple[int, int | None]] = set()  # (pid, start) known not to be ours
        self.listed_child = False
        self.listed_any = False
        self.cpu_s = 0.0  # reaped processes, their waited-for children included
        self.status: int | None = None
        self.host_peak: int | None = None  # the child's largest anonymous resident memory seen
        self.left: list[dict] = []  # processes still running when the child ended, stopped here
        self.timed_out = False
        self.caller_gone = False

    def run(self) -> dict:
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.driver_ok = bool(self.driver) and self.driver.start()
        try:
            self._watch()
        finally:
            if self.driver_ok:
                self.driver.stop()
        return self.report()

    def _watch(self) -> None:
        while self.status is None:
            self._reap()
            if self.status is not None:
                break
            self._sample()
            now = time.perf_counter()
            if now >= self.deadline:
                self.timed_out = True
                self._stop_all()
                continue
            watched = [s for s in (self.marks, self.caller) if s is not None]
            # At least the interval between readings, and twice the last reading's cost: NVML answers one caller at a
            # time, and many runs at once must not spend the machine's cores asking it.
            wait = max(self.interval_s, 2 * self.last_read_s)
            ready, _, _ = select.select(watched, [], [], min(wait, max(0.0, self.deadline - now)))
            if self.marks is not None and self.marks in ready:
                self._marked()
            if self.caller is not None and self.caller in ready:
                with contextlib.suppress(OSError):
                    if not self.caller.recv(1, socket.MSG_PEEK):
                        self.caller_gone = True
                        self._stop_all()
        self._sample()
        # The child has ended: what it left running is part of the run, and stops with it.
        for pid in descendants(self.me):
            self.left.append({"pid": pid, "command": command(pid)})
        self._stop_all()
        end = time.perf_counter() + 5
        while descendants(self.me) and time.perf_counter() < end:
            self._reap(block=True)
        self._reap()

    def _marked(self) -> None:
        try:
            data = self.marks.recv(16)
        except OSError:
            data = b""
        if not data:  # the child closed its end (it is ending): stop listening
            self.marks = None
            return
        for byte in data:
            what = bytes([byte])
            name = {MARK_READY: "ready", MARK_FIGURES: "figures"}.get(what)
            if name is None or name in self.at:
                continue  # a mark repeated or unknown: the first one stands
            used = self._sample()
            self.at[name] = {
                "t": round(time.perf_counter() - self.start, 4),
                "driver": used,
                "cpu_s": cpu_seconds(self.child),
                "rss_bytes": rss_bytes(self.child),
            }
            if what == MARK_FIGURES:
                with contextlib.suppress(OSError):
                    self.marks.sendall(ACK)

    def _sample(self) -> int | None:
        """Read the host memory and the driver once; the child's bytes on the GPU (None without a reading)."""
        if self.status is None and (host := rss_bytes(self.child)) is not None:
            self.host_peak = host if self.host_peak is None else max(self.host_peak, host)
        if not self.driver_ok:
            return None
        try:
            began = time.perf_counter()
            used = self.driver.sample()
            self.last_read_s = time.perf_counter() - began
        except Exception as err:  # noqa: BLE001 - a GPU lost mid-run: the witness says so
            self.driver_ok, self.driver.reason = False, f"NVML failed during the run: {type(err).__name__}: {err}"
            return None
        self.samples += 1
        self.listed_any = self.listed_any or bool(used)
        mine = used.get(self.child)
        if self.child in used:
            self.listed_child = True
            if mine is not None and (self.peak is None or mine > self.peak):
                self.peak, self.peak_t = mine, round(time.perf_counter() - self.start, 4)
        for pid, bytes_ in used.items():
            if pid == self.child:
                continue
            key = (pid, started(pid))
            if key in self.strangers:
                continue
            if pid in self.others or descends(pid, self.me):
                seen = self.others.setdefault(pid, {"pid": pid, "command": command(pid), "used_bytes": 0})
                seen["used_bytes"] = max(seen["used_bytes"], bytes_ or 0)
            else:
                self.strangers.add(key)
        return mine

    def _reap(self, block: bool = False) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self.cpu_s += usage.ru_utime + usage.ru_stime
            if pid == self.child:
                self.status = status
            if block:
                return

    def _stop_all(self) -> None:
        """Kill the child's session and every process below this one (orphans come here: a subreaper)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child, signal.SIGKILL)
        for pid in descendants(self.me):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def report(self) -> dict:
        code = os.waitstatus_to_exitcode(self.status) if self.status is not None else None
        ready = self.at.get("ready", {})
        driver = {
            "available": self.driver_ok,
            "reason": "" if self.driver_ok else (self.driver.reason if self.driver else "not asked"),
        }
        if self.driver_ok and ready and not self.listed_child:
            # The child had a CUDA context at "ready", yet the driver never listed its id.
            driver.update(
                available=False,
                reason=(
                    "the driver lists processes on the GPU, none with the measured process's id: in a container the driver "
                    "names processes by the host's ids"
                    if self.listed_any
                    else "the driver lists no process on the GPU: a container hides them from it"
                ),
            )
        if self.driver_ok:
            driver.update(
                peak_bytes=self.peak,
                peak_t=self.peak_t,
                at_ready_bytes=ready.get("driver"),
                at_figures_bytes=self.at.get("figures", {}).get("driver"),
                samples=self.samples,
                sample_s_mean=round(self.driver.call_s / max(self.driver.calls, 1), 6),
                sample_s_max=round(self.driver.max_call_s, 6),
            )
        at_ready_cpu = ready.get("cpu_s")
        mine = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "supervisor_cpu_s": round(mine.ru_utime + mine.ru_stime, 3),  # the witness's own cost
            "returncode": code,
            "timed_out": self.timed_out,
            "caller_gone": self.caller_gone,
            "process_s": round(time.perf_counter() - self.start, 4),
            "interval_s": self.interval_s,
            "marks": self.at,
            "driver": driver,
            "other_gpu_processes": sorted(self.others.values(), key=lambda p: p["pid"]),
            "left_running": self.left,
            "cpu_s": round(self.cpu_s, 3),
            "script_cpu_s": round(self.cpu_s - at_ready_cpu, 3) if at_ready_cpu is not None else None,
            "maxrss_bytes": self.host_peak,
            "rss_at_ready_bytes": ready.get("rss_bytes"),
        }
