"""The report folder the OOM hook writes: one folder per OOM, one sub-folder per device.

::

    DIR/20260101-120000-pid4242/
      README.txt            what each file is, and how to open the snapshot
      exception.txt         the OOM's type, message and traceback, as Python printed it
      finding.json, .txt    what to fix first (oomlab.steps.fix_first over everything below); when it
                            failed and, under torchrun, which rank of how many it was
      holders.json, .txt    the objects that keep GPU memory alive (the hunt tool's walk)
      cuda0/
        snapshot.pickle     the allocator's snapshot of this device (protocol 4: PyTorch's viewer reads it)
        fragmentation.json  the snapshot tool's analysis: live, free and stranded memory, who pinned it
        fragmentation.txt   the same as ``oomlab snapshot`` prints it
      cuda1/ ...            every other device the process used
      error.txt             only when part of the report failed: what, and why

Every figure and finding comes from the workflow's own tools, so the folder
says what ``oomlab snapshot`` and ``oomlab hunt`` would have said of this
moment: :func:`oomlab.tools.snapshot.analysis.analyze` per device,
:class:`oomlab.tools.hunt.probe.Probe` for the holders, and
:func:`oomlab.steps.fix_first` for the finding. Python objects belong to the
process, not to a device, so the holders and the finding sit above the device
folders; the finding's ``found_by`` names the device (``snapshot cuda1``).

Each part is written on its own: a part that fails is described in
``error.txt`` and the others are still written. :func:`write_report` itself
never raises.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

from oomlab.course.state import write_atomic
from oomlab.frames import failed_at
from oomlab.oom import first_line, parse_message
from oomlab.steps import fix_first
from oomlab.tools.base import error_result
from oomlab.tools.snapshot.analysis import analyze, oom_events
from oomlab.tools.snapshot.probe import ALLOCATOR_STATS, write_snapshot_pickle

__all__ = ["device_snapshot", "failed_device", "finding_text", "plain_text", "readme_text", "write_report"]

VIEWER = "https://pytorch.org/memory_viz"
TEXT_WIDTH = 120


class Problems(list):
    """What went wrong while writing the report, one entry per part, each with its traceback."""

    def attempt(self, what: str, action, *args, **kwargs):
        """``action(*args, **kwargs)``, or None with the failure recorded: one part's failure spares the others."""
        try:
            return action(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the OOM is what matters; this part is only described
            self.append(f"{what}: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            return None


# --------------------------------------------------------------------------- pure parts


def device_snapshot(snapshot: dict, device: int) -> dict:
    """The part of a whole-process snapshot that is about ``device``: its segments, and its history alone.

    The history stays at its index in ``device_traces`` (the others emptied),
    so PyTorch's viewer shows it as that device's. A segment that names no
    device (a snapshot from elsewhere) is kept.
    """
    segments = [seg for seg in snapshot.get("segments") or [] if seg.get("device", device) == device]
    traces = snapshot.get("device_traces") or []
    return {**snapshot, "segments": segments, "device_traces": [t if i == device else [] for i, t in enumerate(traces)]}


def failed_device(message: str, snapshots: dict[int, dict]) -> int | None:
    """The device whose allocation failed: the one whose history has an "oom" entry, else the message's "GPU N".

    With one device there is no question. None when neither says.
    """
    with_oom = [device for device, snap in snapshots.items() if oom_events(snap)]
    if len(with_oom) == 1:
        return with_oom[0]
    match = re.search(r"\bGPU (\d+)\b", message or "")
    if match and int(match.group(1)) in snapshots:
        return int(match.group(1))
    if len(snapshots) == 1:
        return next(iter(snapshots))
    return None


def plain_text(renderables: list, width: int = TEXT_WIDTH) -> str:
    """What a tool's ``render()`` shows in the terminal, as plain text for a file: no colour, no escape codes."""
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, record=True, color_system=None, highlight=False)
    for part in renderables:
        console.print(part)
    return console.export_text()


def finding_text(finding: dict) -> str:
    """``finding.json`` for people: the OOM, what to fix first and why, then what each part found."""
    lines = [f"{finding['exception']['type']}: {finding['exception']['message']}"]
    where = finding.get("failed_at") or {}
    if where.get("line_no"):
        lines.append(f"raised at {os.path.basename(finding['script'] or '')}:{where['line_no']}: {where['line']}")
    if finding.get("failed_device") is not None:
        lines.append(f"on cuda:{finding['failed_device']}")
    lines += ["", f"Fix first: {finding['fix_first'] or 'nothing structural'}"]
    if finding["found_by"]:
        lines[-1] += f" (found by {finding['found_by']})"
    lines += [
        finding["headline"],
        *([finding["why"]] if finding.get("why") else []),
        "",
        finding["advice"],
        "",
        "What each part found:",
    ]
    width = max((len(name) for name in finding["findings"]), default=0)
    for name, found in finding["findings"].items():
        lines.append(f"  {name:<{width}}  {found['kind']:<15} {found['headline']}")
    if not finding["history_recorded"]:
        lines += [
            "",
            "Allocation history was not recorded, so the snapshot cannot say which line allocated each block: "
            "use oom_report(..., record_history=True) to name them.",
        ]
    lines += ["", finding["then"]]
    return "\n".join(lines) + "\n"


def readme_text(folder: Path, devices: list[int], problems: bool) -> str:
    """``README.txt``: what each file of this report is, and how to open the snapshot."""
    rows = [
        ("exception.txt", "the out-of-memory error: its type, message and traceback"),
        ("finding.txt", "what to fix first, and what each part of the report found (finding.json: the same as data)"),
        ("holders.txt", "the Python objects that keep GPU memory alive, and their paths (holders.json: as data)"),
    ]
    for device in devices:
        rows += [
            (f"cuda{device}/snapshot.pickle", f"the caching allocator's snapshot of cuda:{device} at the OOM"),
            (f"cuda{device}/fragmentation.txt", "its analysis: live, free and stranded memory, and which blocks pin segments"),
            (f"cuda{device}/fragmentation.json", "the same analysis as data"),
        ]
    if problems:
        rows.append(("error.txt", "what part of this report could not be written, and why"))
    width = max(len(name) for name, _ in rows)
    listing = "\n".join(f"  {name:<{width}}  {what}" for name, what in rows)
    example = f"cuda{devices[0]}/snapshot.pickle" if devices else "cuda0/snapshot.pickle"
    no_device = "" if devices else "\nNo CUDA device had allocator activity in this process, so there is no snapshot.\n"
    ranked = launcher_rank()
    if ranked:
        of = f" of {ranked[1]}" if ranked[1] else ""
        no_device += (
            f"\nThis process was rank {ranked[0]}{of} (RANK and WORLD_SIZE, as its launcher set them). Every rank that ran "
            "out of memory wrote a folder of its own beside this one, named by its rank.\n"
        )
    return (
        f"OOM report written by oomlab's OOM hook when the process ran out of GPU memory ({folder.name}).\n"
        "The out-of-memory error was raised again, unchanged, after this report was written.\n"
        f"{no_device}\n"
        f"{listing}\n\n"
        "Opening a snapshot:\n"
        f"  - in a browser: drag the .pickle onto {VIEWER} (PyTorch's memory viewer; needs the internet);\n"
        f"  - offline: `oomlab snapshot {example}` reads it again and draws the segment map and the timeline;\n"
        f"  - `python -m torch.cuda._memory_viz stats {example}` prints its totals.\n"
        "File names in the snapshot are relative to the script's folder, so the report can be shared.\n"
    )


# --------------------------------------------------------------------------- the folder


def launcher_rank() -> tuple[int, int | None] | None:
    """``(rank, world size)`` as torchrun and torch.distributed's launchers set them (``RANK``, ``WORLD_SIZE``).

    None outside such a launcher. Read from the environment, not from ``torch.distributed``: the
    report must name its rank even when the process group was never started or is the thing that broke.
    """
    try:
        rank = int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
    try:
        world = int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        world = None
    return rank, world


def report_folder(base: Path) -> Path:
    """A new folder ``base/<date>-<time>-pid<pid>``; a second OOM in the same second gets ``-2``, ``-3``...

    Under a distributed launcher the rank comes before the pid (``-rank3-pid4242``): every rank that
    runs out of memory writes its own folder into the same ``base``, and the rank tells them apart.
    """
    ranked = launcher_rank()
    rank = f"-rank{ranked[0]}" if ranked else ""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}{rank}-pid{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = base / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{base / stem} and 998 more like it exist already")


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def write_report(
    base: Path,
    exc: BaseException,
    *,
    allocator,
    devices: list[int] | None,
    hunt,
    script: str | None,
    script_globals: dict | None,
    root: str | None,
    history_recorded: bool,
    max_entries: int | None,
    problems: list[str] = (),
) -> Path | None:
    """Write the report of ``exc`` under ``base`` and return its folder; None when not even the folder could be made.

    Args:
        allocator: a :class:`~oomlab.oom_hook.allocator.CudaAllocator` (or a stand-in with its methods).
        devices: the devices to report; None: every device the allocator was active on.
        hunt: the hook's :class:`oomlab.tools.hunt.probe.Probe` (its step hook started on entry, with ``watch_steps``).
        script: the training script, to name lines in it; ``root`` names files in the shared snapshot.
        script_globals: the script's module namespace, where the holders' walk also starts.
        history_recorded: whether allocation history was on, for the finding's note.
        max_entries: the history's ring-buffer size, to tell a history that starts mid-run.
        problems: what went wrong before the OOM (starting the history), for ``error.txt``.
    """
    found = Problems(problems)
    oom_at = time.time()  # when it failed: the ranks' reports side by side say which rank failed first
    try:
        folder = report_folder(Path(base))
    except Exception as err:  # noqa: BLE001 - no folder to put error.txt in: stderr is all there is
        print(f"[oomlab] out of memory, but the OOM report could not be written under {base}: {err}", file=sys.stderr)
        return None

    # First what must be read while the failed state is alive: the allocator, then the objects.
    if devices is None:
        devices = found.attempt("finding the devices the process used", allocator.active_devices) or []
    whole = found.attempt("taking the allocator snapshot", allocator.snapshot) if devices else None
    holders = found.attempt("walking the objects that hold GPU memory", hunt.analyse, exc, script_globals)
    if holders is None:
        holders = error_result("hunt", "the walk failed; error.txt says why")

    found.attempt("writing exception.txt", lambda: write_atomic(folder / "exception.txt", _exception_text(exc)))
    found.attempt("writing holders.json", write_json, folder / "holders.json", holders)
    found.attempt("writing holders.txt", _write_rendered, folder / "holders.txt", "hunt", holders)

    snapshots = {d: device_snapshot(whole, d) for d in devices} if whole is not None else {}
    failed = found.attempt("telling which device failed", failed_device, str(exc), snapshots)
    results = {}
    for device in sorted(snapshots, key=lambda d: d != failed):  # the failed device first: it wins a tie
        result = found.attempt(
            f"analysing cuda:{device}",
            _device_report,
            folder / f"cuda{device}",
            snapshots[device],
            exc if device == failed else None,
            found,
            allocator=allocator,
            device=device,
            script=script,
            root=root,
            max_entries=max_entries if history_recorded else None,
        )
        if result is not None:
            results[f"snapshot cuda{device}"] = result
    results["hunt"] = holders

    def finding() -> dict:
        ranked = launcher_rank()
        return {
            **fix_first(results),
            "time": oom_at,
            "rank": ranked[0] if ranked else None,
            "world_size": ranked[1] if ranked else None,
            "exception": {"type": type(exc).__name__, "message": first_line(str(exc), None)},
            "failed_device": failed,
            "failed_at": failed_at(exc, script) if script else {},
            "script": script,
            "devices": sorted(_reported_devices(results)),
            "history_recorded": history_recorded,
        }

    verdict = found.attempt("finding what to fix first", finding)
    if verdict is not None:
        found.attempt("writing finding.json", write_json, folder / "finding.json", verdict)
        found.attempt("writing finding.txt", lambda: write_atomic(folder / "finding.txt", finding_text(verdict)))
    devices_written = sorted(_reported_devices(results))
    if found:
        found.attempt("writing error.txt", lambda: write_atomic(folder / "error.txt", _errors_text(found)))
    found.attempt(
        "writing README.txt", lambda: write_atomic(folder / "README.txt", readme_text(folder, devices_written, bool(found)))
    )
    return folder


def _reported_devices(results: dict) -> list[int]:
    """The devices that have a report among ``results`` (``{"snapshot cuda1": ..., "hunt": ...}``)."""
    return [result["device"] for name, result in results.items() if name.startswith("snapshot cuda")]


def _device_report(
    folder: Path,
    snapshot: dict,
    exc: BaseException | None,
    found: Problems,
    *,
    allocator,
    device: int,
    script: str | None,
    root: str | None,
    max_entries: int | None,
) -> dict:
    """One device's ``snapshot.pickle`` and fragmentation report; returns the analysis.

    As the snapshot tool does, the failed request's exact size comes from the
    history's "oom" entry, and only without one from the message (rounded as it
    is). ``exc`` is given for the device that failed, None for the others. A
    pickle that cannot be written goes into ``found``; the analysis is still written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    pickled = found.attempt(
        f"writing cuda{device}/snapshot.pickle", write_snapshot_pickle, snapshot, folder / "snapshot.pickle", root
    )
    parsed = parse_message(str(exc)) if exc is not None else {"request": None, "allowed": None}
    request = None if oom_events(snapshot) else parsed["request"]
    result = analyze(snapshot, failed_request=request, script=script, budget_bytes=parsed["allowed"], max_entries=max_entries)
    if request is not None:
        result["oom"]["source"] = "message"
    result.update(
        device=device,
        failed_here=exc is not None,
        allocator_stats=found.attempt(f"reading cuda:{device}'s statistics", allocator.allocator_stats, device, ALLOCATOR_STATS)
        or {},
        snapshot_file="snapshot.pickle" if pickled else None,
        out_dir=folder.name,  # relative to the report's folder, as README.txt names the files: the report travels
    )
    write_json(folder / "fragmentation.json", result)
    found.attempt(f"writing cuda{device}/fragmentation.txt", _write_rendered, folder / "fragmentation.txt", "snapshot", result)
    return result


def _write_rendered(path: Path, tool: str, result: dict) -> None:
    from oomlab.tools import presenter

    write_atomic(path, plain_text(presenter(tool).render(result)))


def _exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _errors_text(problems: list[str]) -> str:
    head = (
        "Parts of this OOM report could not be written; the rest of the folder is complete.\n"
        "The out-of-memory error itself was raised again, unchanged.\n\n"
    )
    return head + "\n".join(f"{i}. {problem}" for i, problem in enumerate(problems, 1))
