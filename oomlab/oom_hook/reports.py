"""Reading what the hook wrote: one report, or every rank's report of a torchrun job, side by side.

A job of N ranks that installed the hook leaves one folder per rank that ran out of memory,
all in one base folder (:func:`oomlab.oom_hook.report.report_folder` names each by its rank).
:func:`rank_rows` turns them into the rows of :func:`oomlab.tools.ranks.analysis.across`, so
``oomlab diagnose oom-reports/`` says what the tools say of a job they ran: which rank failed
first and where, what each rank's memory and holders were at its OOM, and what differs. A rank
of the job with no report is a row too: it did not run out of memory, or died before it could
write (killed by the launcher once another rank failed).

The layout is :mod:`oomlab.oom_hook.report`'s; what each figure means, the snapshot tool's.
"""

from __future__ import annotations

from pathlib import Path

from oomlab.course.state import read_json_object
from oomlab.tools.ranks import largest_holders

__all__ = ["FINDING", "find_reports", "load_report", "rank_rows"]

FINDING = "finding.json"  # the file that makes a folder a report
# The failed device's allocator statistics (fragmentation.json's allocator_stats) -> the figures set side by side.
FIGURES = {
    "peak_allocated": "peak_allocated",
    "peak_reserved": "peak_reserved",
    "allocated_final": "allocated",
    "reserved_final": "reserved",
    "inactive_split_final": "inactive_split",
}


def find_reports(folder: Path) -> list[Path]:
    """The report folders in ``folder``: itself if it is one, else those directly inside it, by name."""
    folder = Path(folder)
    if (folder / FINDING).is_file():
        return [folder]
    try:
        return sorted(p for p in folder.iterdir() if (p / FINDING).is_file())
    except OSError:
        return []


def load_report(folder: Path) -> dict | None:
    """A report's finding, holders and the failed device's analysis; None when its finding cannot be read."""
    finding = read_json_object(Path(folder) / FINDING)
    if finding is None:
        return None
    device = finding.get("failed_device")
    analysis = read_json_object(Path(folder) / f"cuda{device}" / "fragmentation.json") if isinstance(device, int) else None
    return {
        "folder": Path(folder),
        "finding": finding,
        "holders": read_json_object(Path(folder) / "holders.json") or {},
        "device": analysis or {},
    }


def _row(report: dict, first_time: float) -> dict:
    finding, holders = report["finding"], report["holders"]
    stats = report["device"].get("allocator_stats") or {}
    failed = finding.get("failed_at") or {}
    script = Path(finding.get("script") or "").name
    return {
        "rank": finding["rank"],
        "status": "oom",
        "where": f"{script}:{failed['line_no']}" if script and failed.get("line_no") else "",
        "error_type": (finding.get("exception") or {}).get("type", ""),
        "message": (finding.get("exception") or {}).get("message", ""),
        "ended_s": round(float(finding["time"]) - first_time, 3) if isinstance(finding.get("time"), int | float) else None,
        **{key: stats[name] for key, name in FIGURES.items() if isinstance(stats.get(name), int)},
        "kind": finding.get("fix_first"),
        "headline": finding.get("headline"),
        "culprit": holders.get("culprit"),
        "culprit_bytes": holders.get("culprit_bytes"),
        "holders": largest_holders(holders.get("holders") or []),
        "report": report["folder"].name,
    }


def rank_rows(reports: list[dict]) -> tuple[list[dict], list[str]]:
    """One row per rank of the job, and notes on what was left out.

    The job is the ranks' latest reports (a folder used by earlier runs keeps theirs): for each
    rank, its newest report; reports without a rank (not under a launcher) are left out and
    said so. Each rank of the world size that wrote none gets a row of status ``unreported``.
    """
    notes = []
    ranked = [r for r in reports if isinstance(r["finding"].get("rank"), int)]
    if len(ranked) < len(reports):
        notes.append(f"{len(reports) - len(ranked)} report(s) were not written under a launcher (no rank): left out")
    latest: dict[int, dict] = {}
    for report in sorted(ranked, key=lambda r: r["finding"].get("time") or 0):
        latest[report["finding"]["rank"]] = report
    if len(latest) < len(ranked):
        notes.append(f"{len(ranked) - len(latest)} older report(s) of the same ranks: left out (each rank's newest is shown)")
    times = [r["finding"]["time"] for r in latest.values() if isinstance(r["finding"].get("time"), int | float)]
    rows = [_row(report, min(times, default=0.0)) for report in latest.values()]
    worlds = [r["finding"].get("world_size") for r in latest.values() if isinstance(r["finding"].get("world_size"), int)]
    for rank in range(max(worlds, default=0)):
        if rank not in latest:
            rows.append({"rank": rank, "status": "unreported", "where": "", "error_type": "", "message": "", "ended_s": None})
    return sorted(rows, key=lambda r: r["rank"]), notes
