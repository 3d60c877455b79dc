"""A tool on every rank of a torchrun job, and the view across the ranks (``ranks.json``).

``oomlab hunt torchrun --nproc-per-node 2 train.py`` runs the job with
:mod:`oomlab.measure.ranks`, the hunt's probe in every rank; each rank's report is
``OUT/rank<R>/hunt.json``, as one run's would be, and :func:`run_ranks` sets them side by
side (:mod:`~oomlab.tools.ranks.analysis`) into ``OUT/ranks.json``;
:mod:`~oomlab.tools.ranks.present` shows it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from oomlab.course.state import read_json_object, write_atomic
from oomlab.measure.ranks import RankRun, launch
from oomlab.oom import first_line
from oomlab.tools.base import run_summary
from oomlab.tools.ranks.analysis import COLUMNS, across, where_waiting

__all__ = ["HOLDERS_COMPARED", "largest_holders", "rank_row", "run_ranks", "signal_name"]

HOLDERS_COMPARED = 10  # each rank's largest holders set side by side


def rank_row(run: RankRun, script: str, finding: dict | None) -> dict:
    """One rank's row for :func:`~oomlab.tools.ranks.analysis.across`: its ending, figures, stacks and finding."""
    m = run.measurement
    stats = m.stats or {}
    row = {
        "rank": run.rank,
        "pid": run.pid,
        "status": m.status,
        "where": m.where,
        "error_type": m.error_type,
        "message": first_line(m.message),
        "ended_s": run.ended_s,
        "stopped": run.stopped_s is not None,
        "stopped_s": run.stopped_s,
        "waiting": where_waiting(run.stacks, script) if run.stacks else None,
        "wall_s": m.wall_s,
        "returncode": run.returncode,
        "signal": signal_name(run.returncode),
        **{key: stats.get(key) for key, _ in COLUMNS if key in stats},
        "ooms": stats.get("ooms"),  # out-of-memory errors raised in the rank, the ones it caught included
        "driver_peak": run.driver_peak_bytes,
        "collectives": run.collectives,
        "issued": run.issued,
        "stdout": m.stdout,
        "stderr": m.stderr,
    }
    if finding:
        row.update({k: finding.get(k) for k in ("kind", "headline", "culprit", "culprit_bytes", "culprit_path", "error")})
        if isinstance(finding.get("holders"), list):  # the hunt's
            row["holders"] = largest_holders(finding["holders"])
    return row


def signal_name(returncode: int | None) -> str | None:
    """``SIGKILL`` for an exit status of -9: the signal that ended a process, where one did."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def largest_holders(holders: list[dict]) -> dict[str, int]:
    """A hunt's :data:`HOLDERS_COMPARED` largest holders as ``{name: bytes}``: what is set side by side across ranks."""
    largest = sorted(holders, key=lambda h: -int(h.get("bytes") or 0))[:HOLDERS_COMPARED]
    return {h["name"]: int(h.get("bytes") or 0) for h in largest if h.get("name")}


def run_ranks(
    target,
    tool: str,
    probe: str,
    out_dir: Path,
    options: dict,
    *,
    require_cuda: bool = True,
) -> dict:
    """Run ``target`` (a :class:`oomlab.tools.run.Target` with ``ranks``) with ``tool``'s probe in every rank.

    Returns the cross-rank result, with each rank's own report under ``reports``; writes it to
    ``out_dir/ranks.json``.
    """
    runs, job = launch(
        target.script,
        target.ranks,
        budget_bytes=target.budget_bytes,
        alloc_conf=target.alloc_conf,
        time_limit_s=target.time_limit_s,
        args=target.args,
        tool={"name": tool, "probe": probe, "out_dir": str(out_dir), "options": options},
        require_cuda=require_cuda,
    )
    reports, rows = {}, []
    for run in runs:
        path = out_dir / f"rank{run.rank}" / f"{tool}.json"
        report = read_json_object(path)
        if report is not None:
            report["out_dir"] = str(path.parent)
            report["budget_bytes"] = target.budget_bytes
            report["run"] = run_summary(run.measurement)
            reports[run.rank] = report
        rows.append(rank_row(run, str(target.script), report))
    result = across(rows, tool)
    result.update(job=job, label=target.label, out_dir=str(out_dir))
    write_atomic(out_dir / "ranks.json", json.dumps(result, indent=1) + "\n")
    result["reports"] = reports
    return result
