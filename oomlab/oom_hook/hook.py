"""The hook itself: a context manager and decorator (:class:`OomReport`), and :func:`install` for a whole script.

Entering the hook starts what the report needs later: the allocator's history
(unless the script records one already, or ``record_history=False``) and the
hunt's optimizer step hook (``watch_steps``). Leaving it stops them again. In
between, an exception that is an out-of-memory error (or that was raised from
one) is reported by :func:`oomlab.oom_hook.report.write_report` before it
propagates; nothing of the hook runs on any other exception.

What the hook must never do is change the error it reports: the report runs
inside one guard that catches everything, and ``__exit__`` always returns
False, so Python re-raises the original exception object with its own
traceback. The one addition is an attribute, ``oomlab_report``, the report's
folder, which also keeps two nested hooks from writing the same OOM twice.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.oom import is_oom
from oomlab.oom_hook.allocator import STACKS, CudaAllocator
from oomlab.oom_hook.report import write_report
from oomlab.tools.hunt.probe import Probe as HuntProbe

__all__ = ["DEFAULT_FOLDER", "DEFAULT_MAX_ENTRIES", "REPORTED", "OomReport", "install", "oom_report", "uninstall"]

DEFAULT_FOLDER = "oom-reports"
# The ring buffer of allocator events. A training step makes about three events per tensor (alloc,
# free requested, free completed), so 100,000 keep the last few hundred steps of a small model: enough
# to see what grew before the OOM. The events live in host memory, not GPU memory: 25 MB for a full
# buffer of a transformer's (python -m oomlab.bench.oom_hook).
DEFAULT_MAX_ENTRIES = 100_000
REPORTED = "oomlab_report"  # the attribute an exception gets once reported: the report's folder


def import_torch():
    """The torch the hook talks to; the tests replace this with one whose ``torch.cuda`` is a fake."""
    import torch

    return torch


@dataclass(frozen=True)
class Options:
    """What :class:`OomReport` was given, checked."""

    folder: Path
    record_history: bool
    max_entries: int
    stacks: str
    devices: tuple[int, ...] | None
    watch_steps: bool
    script: str | None


def _checked(folder, record_history, max_entries, stacks, devices, watch_steps, script) -> Options:
    """The options, or one :class:`OomLabError` that says which is wrong and what to give instead."""
    if not isinstance(folder, (str, os.PathLike)) or not os.fspath(folder):
        raise OomLabError(
            f"oom_report: the folder must be a path, not {folder!r}.", f'Give a folder name, such as "{DEFAULT_FOLDER}".'
        )
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OomLabError(
            f"oom_report: {folder} is a file, not a folder.", "Give a folder for the reports (it is made if missing)."
        )
    for name, value in (("record_history", record_history), ("watch_steps", watch_steps)):
        if not isinstance(value, bool):
            raise OomLabError(f"oom_report: {name} must be True or False, not {value!r}.")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise OomLabError(
            f"oom_report: max_entries must be a positive whole number, not {max_entries!r}.",
            f"It is how many allocator events the history keeps; the default is {DEFAULT_MAX_ENTRIES:,}.",
        )
    if stacks not in STACKS:
        raise OomLabError(
            f"oom_report: stacks must be one of {', '.join(map(repr, STACKS))}, not {stacks!r}.",
            '"python" records Python frames only, which is cheap; "all" adds C++ frames and costs many times more.',
        )
    if devices is not None:
        try:
            devices = tuple(devices)
        except TypeError:
            devices = (devices,)
        if not devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
            raise OomLabError(
                f"oom_report: devices must be CUDA device numbers such as [0, 1], not {devices!r}.",
                "Leave it out to report every device the process used.",
            )
    if script is not None:
        if not isinstance(script, (str, os.PathLike)) or not os.path.isfile(script):
            raise OomLabError(
                f"oom_report: script {script!r} is not a file.", "Give the training script's path, or leave it out."
            )
        script = os.path.abspath(script)
    return Options(folder, record_history, max_entries, stacks, devices, watch_steps, script)


def _oom_of(exc: BaseException | None) -> BaseException | None:
    """``exc`` if it is an OOM, else the OOM it was raised from or while handling (a wrapper's cause), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if is_oom(exc):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class _HoldersBaseline(HuntProbe):
    """The hunt tool's probe, with its optimizer step hook idle once the baseline is taken.

    The hunt tool also samples ``memory_allocated()`` after every step, for its
    picture; that call builds every allocator statistic in Python, about 0.4 ms
    a step on an H200, which a loop of short steps feels (``python -m
    oomlab.bench.oom_hook``). The report needs only the baseline, so after it
    the hook counts steps and returns. It stays registered: removing a hook
    while the optimizer runs its hooks would change the dict it is iterating.
    """

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.step_count >= self.baseline_step:
            self.step_count += 1  # the holders report how many optimizer steps ran
            return
        super()._after_step(optimizer, args, kwargs)


class _Session:
    """One use of the hook: what it started on entry, and the report of an OOM while it was active."""

    def __init__(self, options: Options):
        self.options = options
        self.torch = import_torch()
        self.allocator = CudaAllocator(self.torch)
        self.problems: list[str] = []  # what could not be started; written into the report's error.txt
        self.owns_history = False
        main = sys.modules.get("__main__")
        main_file = getattr(main, "__file__", None)
        self.script = options.script or (os.path.abspath(main_file) if main_file else None)
        # The main module's namespace is where a script keeps its globals; not when the hook names another file.
        same = main_file is not None and os.path.abspath(main_file) == self.script
        self.script_globals = vars(main) if main is not None and (same or options.script is None) else None
        self.hunt = _HoldersBaseline(self.torch, options.folder, {"script": self.script} if self.script else {})
        self.lock = threading.Lock()

    def start(self) -> None:
        """Check the devices asked for, then start the history and the step hook; what fails is noted, not raised."""
        count = self.allocator.device_count()
        missing = [d for d in self.options.devices or () if d >= count]
        if missing and count:
            raise OomLabError(
                f"oom_report: devices {missing} do not exist: torch sees {count} CUDA device(s), 0 to {count - 1}.",
                "Give devices that exist, or leave devices out to report every device the process used.",
            )
        if self.options.record_history and count and not self.allocator.history_enabled():
            try:
                self.allocator.start_history(self.options.max_entries, self.options.stacks)
                self.owns_history = True
            except Exception as err:  # noqa: BLE001 - training goes on; the report says the history is missing
                self._problem(f"could not start recording the allocator's history: {type(err).__name__}: {err}")
        if self.options.watch_steps:
            self.hunt.start()  # never raises; a failure is its .error
            if self.hunt.error:
                self._problem(f"the holders' step hook: {self.hunt.error}")

    def report(self, exc: BaseException) -> Path | None:
        """Write the report of the OOM in ``exc`` (if it is one, and not reported yet); never raises."""
        try:
            oom = _oom_of(exc)
            if oom is None:
                return None
            done = getattr(oom, REPORTED, None)
            if done is not None:
                return done
            with self.lock:  # two threads failing at once each get a whole report of their own
                folder = write_report(
                    self.options.folder,
                    oom,
                    allocator=self.allocator,
                    devices=list(self.options.devices) if self.options.devices else None,
                    hunt=self.hunt,
                    script=self.script,
                    script_globals=self.script_globals,
                    root=os.path.dirname(self.script) if self.script else os.getcwd(),
                    history_recorded=self.owns_history or self.allocator.history_enabled(),
                    max_entries=self.options.max_entries if self.owns_history else None,
                    problems=self.problems,
                )
            if folder is not None:
                with contextlib.suppress(Exception):  # an exception type that takes no attributes is reported all the same
                    setattr(oom, REPORTED, folder)
                print(f"[oomlab] out of GPU memory: report in {folder} (README.txt says what is in it)", file=sys.stderr)
            return folder
        except BaseException as err:  # noqa: BLE001 - even Ctrl-C here must leave the OOM to propagate
            with contextlib.suppress(Exception):
                print(f"[oomlab] the OOM report failed: {type(err).__name__}: {err}", file=sys.stderr)
            return None

    def stop(self) -> None:
        """Remove the step hook and stop the history this session started; never raises."""
        with contextlib.suppress(Exception):
            self.hunt.close()
        if self.owns_history:
            self.owns_history = False
            try:
                self.allocator.stop_history()
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"oomlab: could not stop the allocator's history: {err}", RuntimeWarning, stacklevel=3)

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        warnings.warn(f"oomlab: {message}", RuntimeWarning, stacklevel=4)


class OomReport(contextlib.ContextDecorator):
    """Report an out-of-memory error raised inside, then let it propagate unchanged.

    Use it as ``with oom_report("oom-reports"):`` around a training loop or as
    ``@oom_report("oom-reports")`` on the function that trains; see
    :mod:`oomlab.oom_hook` for the options and what the report holds. One
    object may be entered again while it is active (recursion, threads): each
    entry is a session of its own. ``last_report`` is the folder of the last
    report written, or None.
    """

    def __init__(
        self,
        folder: str | os.PathLike = DEFAULT_FOLDER,
        *,
        record_history: bool = True,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        stacks: str = "python",
        devices=None,
        watch_steps: bool = True,
        script: str | os.PathLike | None = None,
    ):
        self.options = _checked(folder, record_history, max_entries, stacks, devices, watch_steps, script)
        self.last_report: Path | None = None
        self._local = threading.local()  # this thread's active sessions, innermost last

    def __enter__(self) -> OomReport:
        session = _Session(self.options)
        session.start()
        self._sessions().append(session)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        session = self._sessions().pop()
        try:
            if exc is not None:
                folder = session.report(exc)
                if folder is not None:
                    self.last_report = folder
        finally:
            session.stop()
        return False  # never swallow: Python re-raises the original exception, traceback and all

    def _sessions(self) -> list:
        if not hasattr(self._local, "sessions"):
            self._local.sessions = []
        return self._local.sessions


def oom_report(folder: str | os.PathLike = DEFAULT_FOLDER, **options) -> OomReport:
    """``with oom_report("oom-reports"):`` or ``@oom_report("oom-reports")``: see :class:`OomReport`."""
    return OomReport(folder, **options)


# --------------------------------------------------------------------------- a whole script, no indenting


class _Installation:
    """The hook as ``sys.excepthook`` and ``threading.excepthook``: report an uncaught OOM, then hand it on."""

    def __init__(self, hook: OomReport):
        self.hook = hook
        self.session = _Session(hook.options)
        self.active = True
        self.previous_sys = sys.excepthook
        self.previous_threading = threading.excepthook

    def excepthook(self, exc_type, exc, tb) -> None:
        self._report(exc)
        self.previous_sys(exc_type, exc, tb)

    def threading_excepthook(self, args) -> None:
        self._report(args.exc_value)
        self.previous_threading(args)

    def _report(self, exc) -> None:
        if self.active and exc is not None:
            folder = self.session.report(exc)
            if folder is not None:
                self.hook.last_report = folder


_installed: _Installation | None = None
_install_lock = threading.Lock()


def install(folder: str | os.PathLike = DEFAULT_FOLDER, **options) -> OomReport:
    """Report any OOM the script does not catch, in the main thread or another, with one line at its top.

    Wraps ``sys.excepthook`` and ``threading.excepthook``: the report is written
    while the exception's frames are still alive, then the previous hook prints
    the traceback as usual. Takes the options of :class:`OomReport` and returns
    it (``last_report`` names the last report). Installing again replaces the
    earlier installation; :func:`uninstall` removes it. An OOM the script catches
    is not reported: put ``with oom_report(...)`` around the code that catches it.
    """
    global _installed
    hook = OomReport(folder, **options)
    with _install_lock:
        _uninstall()
        installation = _Installation(hook)
        installation.session.start()
        sys.excepthook = installation.excepthook
        threading.excepthook = installation.threading_excepthook
        _installed = installation
    return hook


def uninstall() -> bool:
    """Undo :func:`install`: the previous excepthooks come back, the history stops. False when none was installed."""
    with _install_lock:
        return _uninstall()


def _uninstall() -> bool:
    global _installed
    installation, _installed = _installed, None
    if installation is None:
        return False
    installation.active = False  # if something wrapped our hooks since, ours now only hands exceptions on
    if sys.excepthook == installation.excepthook:
        sys.excepthook = installation.previous_sys
    if threading.excepthook == installation.threading_excepthook:
        threading.excepthook = installation.previous_threading
    installation.session.stop()
    return True
