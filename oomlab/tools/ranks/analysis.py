"""Every rank of a torchrun job side by side: what differs between them, which failed first, why the others stopped.

One tool run on a torchrun job gives one report per rank (``rank<R>/<tool>.json``); this
module sets them side by side, from plain data, so the tests drive it with no GPU:

- :func:`where_waiting` reads a rank's thread stacks (as :mod:`faulthandler` writes them) for
  the call it was waiting in and the line of the learner's that made it;
- :func:`across` puts each rank's ending, figures and finding in one row, and says:
  **which rank failed first** (the first to end with an error, by the moment its result came);
  **why each other rank stopped**: it finished, it failed after the first in a collective (the
  consequence: its peer was gone), it failed on its own, or it was still waiting when
  :mod:`oomlab.measure.ranks` stopped it, and where; **whether the job is desynchronised**: its
  ranks made different numbers of collective calls, or were left waiting at different ones (an
  OOM caught and skipped on one rank does both), beyond the one call a peer had in flight when
  the first rank died (:func:`in_flight_when_it_died`); and **what differs**: each figure whose
  spread across ranks is at least :data:`SPREAD_FLOOR` and :data:`SPREAD_SHARE` of its largest
  value, a holder whose bytes differ as much, and a finding that only some ranks have.

Standard library only.
"""

from __future__ import annotations

import re

from oomlab.frames import is_learner
from oomlab.units import MIB, format_bytes

__all__ = [
    "COLUMNS",
    "POINT_TO_POINT",
    "SPREAD_FLOOR",
    "SPREAD_SHARE",
    "across",
    "collective_mismatch",
    "in_flight_when_it_died",
    "is_collective_error",
    "held_at",
    "needs_launcher",
    "out_of_step",
    "where_waiting",
]

TOOL = "ranks"

# The figures set side by side: (key in a row, what it is called). The allocator's come from each
# rank's own memory_stats(); the driver's from NVML, read from outside by the pid of each rank.
COLUMNS = (
    ("peak_allocated", "peak allocated"),
    ("peak_reserved", "peak reserved"),
    ("inactive_split_peak", "peak non-releasable"),
    ("allocated_final", "allocated at the end"),
    ("reserved_final", "reserved at the end"),
    ("inactive_split_final", "non-releasable at the end"),
    ("driver_peak", "driver's peak (context, NCCL)"),
)
# A figure differs between ranks when its spread is at least this many bytes and this share of its largest value:
# equal ranks of a data-parallel job differ by a few blocks, and the imbalances that break a job by hundreds of MiB.
SPREAD_FLOOR = 64 * MIB
SPREAD_SHARE = 0.10

# Calls that pair one sender with one receiver: a pipeline's first stage only sends, its middle ones receive and send.
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# What a rank says when its collective failed because another rank was gone: gloo's closed pair, NCCL's watchdog
# and its timeout, the process group's own errors.
_COLLECTIVE = re.compile(
    r"Connection (closed|reset) by peer|NCCL|Watchdog|ProcessGroup|collective operation timeout|"
    r"DistBackendError|DistNetworkError|DistStoreError|gloo",
    re.I,
)
# Why a rank may have been killed by a signal, with no Python error to say so.
SIGNAL_HINTS = {
    "SIGKILL": "no Python error can say why. The kernel's out-of-memory killer ends a process so when the host runs out "
    "of memory (`dmesg` names it), as does `kill -9`; a rank whose host memory grows (a cache, a DataLoader's workers) "
    "is the one to look at",
    "SIGABRT": "a C++ error ended it: the last lines of its output say which (gloo on a collective mismatch, NCCL's "
    "watchdog after its timeout, a CUDA error)",
    "SIGSEGV": "a crash in native code: the last lines of its output, and `faulthandler`, say where",
}
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+) in (\S+)')


def needs_launcher(message: str) -> bool:
    """The run failed because the script starts torch.distributed from the environment a launcher sets (RANK, ...)."""
    return "env:// rendezvous" in (message or "")


def is_collective_error(row: dict) -> bool:
    """The rank's error came out of torch.distributed: a collective or the process group, not the rank's own work."""
    said = f"{row.get('error_type', '')} {row.get('message', '')}"
    return bool(_COLLECTIVE.search(said))


def _short(filename: str) -> str:
    """``torch/distributed/distributed_c10d.py`` from a full path into site-packages; else the file's name."""
    path = filename.replace("\\", "/")
    if "/torch/" in path:
        return "torch/" + path.rsplit("/torch/", 1)[1]
    return path.rsplit("/", 1)[-1]


def _is_distributed(filename: str) -> bool:
    return "/torch/distributed/" in filename.replace("\\", "/")


def where_waiting(stacks: str, script: str) -> dict | None:
    """Where a rank's main work was when its stacks were written: the call it waited in, and the learner's line.

    ``stacks`` is :mod:`faulthandler`'s dump of every thread (most recent call first). The thread
    that runs the script is the one with a frame of the learner's (the script, or a file beside
    it); of its frames, the innermost of the learner's is ``at`` (``train.py:31 in step``), and
    ``call`` is the ``torch.distributed`` function it waits in (``all_reduce``), else the function
    the learner's line called.
    None when no thread ran the learner's code.
    """
    threads: list[list[tuple[str, int, str]]] = []
    for line in stacks.splitlines():
        if _THREAD.match(line.strip()):
            threads.append([])
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1].append((frame[1], int(frame[2]), frame[3]))
    for frames in threads:
        mine = [i for i, (filename, _, _) in enumerate(frames) if is_learner(filename, script)]
        if not mine:
            continue
        inner = frames[: mine[0]]
        # The collective it waits in (all_reduce, not the logging wrapper around it), else what the learner called.
        collectives = [f for f in inner if _is_distributed(f[0]) and not f[2].startswith("_") and f[2] != "wrapper"]
        called = collectives[0] if collectives else (inner[-1] if inner else None)
        filename, line, function = frames[mine[0]]
        return {
            "at": f"{_short(filename)}:{line}",
            "in": function,
            "call": called[2] if called else "",
            "call_at": f"{_short(called[0])}:{called[1]}" if called else "",
            "collective": bool(collectives),
        }
    return None


UNREPORTED = "unreported"  # a rank of the job that left no report (read from the OOM hook's reports)


def _ending(row: dict) -> str:
    if row["status"] == "ok":
        return "finished"
    if row["status"] == UNREPORTED:
        return "wrote no OOM report"
    if row.get("signal"):  # ended by a signal, with no Python error to say where
        return f"was killed by {row['signal']}"
    where = f" at {row['where']}" if row.get("where") else ""
    what = "ran out of memory" if row["status"] == "oom" else f"failed ({row.get('error_type') or row['status']})"
    return f"{what}{where}"


def _waiting(row: dict) -> str:
    waiting = row.get("waiting")
    if not waiting:
        return "still running"
    if not waiting["call"]:  # waiting in the learner's own line: in a CUDA call, such as .item() after NCCL's kernels
        return f"waiting at {waiting['at']}"
    return f"waiting in {waiting['call']} ({waiting['call_at']}), called at {waiting['at']}"


def _earliest(rows: list[dict], finished: bool) -> dict | None:
    """The rank that ended first on its own (not stopped), among those that finished, or those that failed.

    A rank torchrun ended (SIGTERM, sent to every other rank once one fails) comes after one that
    ended at the same moment on its own: the watcher sees the ranks' ends a tick at a time.
    """
    ended = [r for r in rows if (r["status"] == "ok") == finished and not r.get("stopped") and r.get("ended_s") is not None]
    return min(ended, key=lambda r: (r["ended_s"], r.get("signal") == "SIGTERM", r["rank"])) if ended else None


def _after(seconds: float, other: dict) -> str:
    """``2.0 s after rank 1``: a moment measured from when ``other`` ended."""
    return f"{seconds - other['ended_s']:.1f} s after rank {other['rank']}"


def _why_stopped(row: dict, first: dict | None, finished: dict | None) -> str:
    """Why a rank other than the first to fail ended as it did."""
    if row.get("stopped"):
        after = ""
        if first is not None:
            after = f" {_after(row['stopped_s'], first)} failed"
        elif finished is not None:
            after = f" {_after(row['stopped_s'], finished)} finished"
        return f"{_waiting(row)}: stopped{after}"
    if row["status"] == "ok":
        return "finished"
    if row.get("signal") == "SIGTERM" and first is not None and row.get("ended_s") is not None:
        return (
            f"was stopped by torchrun (SIGTERM), {_after(row['ended_s'], first)} failed: it ends the other ranks once one fails"
        )
    if first is not None and is_collective_error(row):
        return f"{_ending(row)} in a collective, {_after(row['ended_s'], first)}: its peer was gone"
    if row["status"] == "timeout":
        return "ran past the time limit"
    if first is not None and row.get("ended_s") is not None:
        return f"{_ending(row)}, {_after(row['ended_s'], first)}"
    return _ending(row)


def _spread(figure: str, label: str, by_rank: dict[int, int], name: str) -> dict | None:
    """A difference when the values' spread is past :data:`SPREAD_FLOOR` and :data:`SPREAD_SHARE`; else None."""
    if len(by_rank) < 2:
        return None
    most, least = max(by_rank.values()), min(by_rank.values())
    if most - least < SPREAD_FLOOR or most - least < SPREAD_SHARE * most:
        return None
    high = max(by_rank, key=lambda rank: (by_rank[rank], -rank))
    low = min(by_rank, key=lambda rank: (by_rank[rank], rank))
    return {
        "figure": figure,
        "label": label,
        "by_rank": by_rank,
        "spread_bytes": most - least,
        "text": f"{name}: rank {high} {format_bytes(most)}, rank {low} {format_bytes(least)} (+{format_bytes(most - least)})",
    }


def _differences(rows: list[dict], tool: str) -> list[dict]:
    found = []
    for key, label in COLUMNS:
        found.append(_spread(key, label, {r["rank"]: r[key] for r in rows if isinstance(r.get(key), int)}, label))
    culprits = {r.get("culprit") for r in rows}
    compared = [r for r in rows if r.get("holders") is not None]
    for name in sorted({name for r in compared for name in r["holders"]} - culprits):
        held = {r["rank"]: int(r["holders"].get(name, 0)) for r in compared}
        found.append(_spread("holder", "what holds memory", held, name))
    findings: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("culprit"):
            findings.setdefault(r["culprit"], []).append(r)
    label = f"what the {tool or 'tool'} found"
    for culprit, having in findings.items():
        if len(having) == len(rows):  # every rank found it: it differs by how much it holds on each, if at all
            found.append(_spread("culprit", label, {r["rank"]: int(r.get("culprit_bytes") or 0) for r in having}, culprit))
            continue
        top = max(having, key=lambda r: r.get("culprit_bytes") or 0)
        held = top.get("culprit_bytes") or 0
        found.append(
            {
                "figure": "culprit",
                "label": label,
                "by_rank": {r["rank"]: culprit for r in having},
                "spread_bytes": held,
                "text": f"only {_ranks([r['rank'] for r in having])}: {culprit} ({format_bytes(held)}){held_at(top)}",
            }
        )
    return [d for d in found if d is not None]


def held_at(row: dict) -> str:
    """``, held at model.2._forward_hooks[4].__closure__['seen']``: where in its culprit a rank's finding lies, when
    the path says more than the culprit's name (a hook's closure inside a model, a list inside a tracker)."""
    path = str(row.get("culprit_path") or "")
    name = str(row.get("culprit") or "").split("'")[1:2]
    first = re.split(r"[.\[ ]", path, maxsplit=1)[0]
    if not path or not name or path == name[0] or "." not in path and "[" not in path or first != name[0]:
        return ""
    return f", held at {path if len(path) <= 90 else path[:89] + '…'}"


def collective_mismatch(rows: list[dict]) -> dict | None:
    """The collectives that the ranks called a different number of times: ``{name: {rank: calls}}``, the collectives each
    rank issued in all where those differ and the calls by name do not (``issued``: ``{rank: n}``), and a sentence.

    The calls by name are the script's own; the number issued in all counts torch's too (DDP's reducer, FSDP's
    hooks), which no name sees. Only ranks that said count; None when they all agree. Point-to-point calls
    (:data:`POINT_TO_POINT`) are not compared: the ranks of an honest pipeline make different numbers of them.
    """
    counted = [r for r in rows if isinstance(r.get("collectives"), dict)]
    differ = {}
    if len(counted) > 1:
        for name in sorted(set().union(*(r["collectives"] for r in counted)) - POINT_TO_POINT):
            calls = {r["rank"]: int(r["collectives"].get(name, 0)) for r in counted}
            if len(set(calls.values())) > 1:
                differ[name] = calls
    said = "; ".join(f"{name}: " + ", ".join(f"rank {rank} {n}" for rank, n in calls.items()) for name, calls in differ.items())
    issued = {r["rank"]: r["issued"] for r in rows if isinstance(r.get("issued"), int)}
    # The number issued in all counts point-to-point calls too: where the job makes any, it says nothing of step.
    paired = any(r["collectives"].get(name) for r in counted for name in POINT_TO_POINT)
    if differ or paired or len(issued) < 2 or len(set(issued.values())) == 1:
        issued = None
    else:
        said = "in all, torch's own calls included: " + ", ".join(f"rank {rank} {n}" for rank, n in issued.items())
    if not differ and not issued:
        return None
    return {"by_name": differ, "issued": issued, "text": said}


def in_flight_when_it_died(rows: list[dict], first: dict | None) -> bool:
    """Whether the ranks' different counts are only the calls in flight when the first rank died of its own error.

    A rank that fails in its own work (an OOM in its forward, say) has made only the calls it
    finished, and each of those needed every rank; a peer then enters its next collective and
    fails there, that call counted. So every other rank made at most one call more than the dead
    one, and none fewer: the consequence of a death, not ranks out of step. In all, torch's own
    calls included, a peer may be further ahead (DDP's reducer starts a bucket's all-reduce as soon as
    its gradients are ready, and waits for them all at the end of backward), but never behind. An
    OOM caught and skipped differs from it: its rank goes on and ends first, or its peer fails first
    in a collective.
    """
    if first is None or is_collective_error(first) or not isinstance(first.get("collectives"), dict):
        return False
    died = first["collectives"]
    for row in rows:
        if row is first or not isinstance(row.get("collectives"), dict):
            continue
        extra = [row["collectives"].get(name, 0) - died.get(name, 0) for name in set(died) | set(row["collectives"])]
        if row["status"] == "ok" or min(extra, default=0) < 0 or sum(extra) > 1:
            return False
        if isinstance(row.get("issued"), int) and isinstance(first.get("issued"), int) and row["issued"] < first["issued"]:
            return False
    return True


def out_of_step(rows: list[dict], first: dict | None, mismatch: dict | None) -> dict | None:
    """The rank that fell out of step, where the first rank to fail only waited for it; None where none did.

    A rank that catches an error (an OOM) and skips its step skips that step's collectives too: it
    goes on, one call short, and often finishes first, while a peer fails in a collective no one
    will make (its peer's connection closed, or its timeout). That peer failed first, but the rank
    to read is the one that made fewer calls: the single rank with the fewest of the calls the ranks
    made different numbers of (:func:`collective_mismatch`), counted in all where the calls by name agree.
    """
    if mismatch is None or first is None or not is_collective_error(first):
        return None
    counts = dict(mismatch["issued"] or {})
    for calls in mismatch["by_name"].values():
        for rank, n in calls.items():
            counts[rank] = counts.get(rank, 0) + n
    fewest = min(counts.values(), default=None)
    short = [rank for rank, n in counts.items() if n == fewest]
    if len(short) != 1 or short[0] == first["rank"]:
        return None
    return next(r for r in rows if r["rank"] == short[0])


def _caught(row: dict) -> str:
    """``caught 1 out-of-memory error``, for a rank whose allocator raised OOMs it did not die of (num_ooms)."""
    ooms = row.get("ooms")
    caught = (ooms or 0) - (row["status"] == "oom") if isinstance(ooms, int) else 0
    return f"caught {caught} out-of-memory error{'s' if caught != 1 else ''}" if caught > 0 else ""


def last_words(stderr: str, most: int = 240) -> str:
    """The last line a rank wrote to its error output, at most ``most`` characters: what a C++ abort says (gloo's
    "Is there a distributed collective mismatch in your code?", a CUDA error)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if len(lines[-1]) <= most else "…" + lines[-1][-(most - 1) :]


def compared(rows: list[dict]) -> bool:
    """Whether the ranks left anything to set side by side: a figure of :data:`COLUMNS`, or the hunt's holders."""
    return any(isinstance(r.get(key), int) for r in rows for key, _ in COLUMNS) or any(r.get("holders") for r in rows)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def across(rows: list[dict], tool: str = "", from_start: bool = True) -> dict:
    """The cross-rank view of one job, from one row per rank; ``ranks.json``.

    A row: ``rank``, ``status``, ``where``, ``message``, ``error_type``, ``ended_s`` (from the job's
    start; None if it never ended on its own), ``stopped`` and ``stopped_s``, ``waiting``
    (:func:`where_waiting`), ``collectives`` (calls by name), ``issued`` (every collective it issued on the default
    group, torch's own included), the figures of :data:`COLUMNS`,
    ``holders`` (``{name: bytes}``, from the hunt), and the rank's finding (``kind``,
    ``headline``, ``culprit``, ``culprit_bytes``). Returns the rows,
    ``first_failure``, each other rank's ``why``, ``desynchronised`` (the ranks made different
    collective calls, :func:`collective_mismatch`, or were left waiting at different calls or
    lines), ``differences``, ``hints`` for what the machine, not the script, refused, and a ``headline``.
    ``from_start=False`` where ``ended_s`` counts from the first report, not from the job's start
    (the OOM hook's reports, which know no start).
    """
    rows = sorted(rows, key=lambda r: r["rank"])
    first, finished = _earliest(rows, finished=False), _earliest(rows, finished=True)
    for row in rows:
        row["ending"] = _ending(row)
        row["why"] = "failed first" if row is first else _why_stopped(row, first, finished)
        if row is not first and (caught := _caught(row)):
            row["why"] += f"; {caught}"
    waits = {(r["waiting"]["call"], r["waiting"]["at"]) for r in rows if r.get("stopped") and r.get("waiting")}
    mismatch = None if in_flight_when_it_died(rows, first) else collective_mismatch(rows)
    desynchronised = len(waits) > 1 or mismatch is not None
    origin = out_of_step(rows, first, mismatch)
    differences = _differences(rows, tool)
    parts = []
    silent = [r["rank"] for r in rows if r["status"] == UNREPORTED]
    if origin is not None:
        caught = _caught(origin)
        parts.append(
            f"rank {origin['rank']} fell out of step: it made fewer collective calls than the others "
            f"({mismatch['text']}){f' after it {caught}' if caught else ''}, and {_why_stopped(origin, first, finished)}"
        )
        origin["why"] += "; out of step: it made fewer collective calls than the others"
    if first is not None:
        after = f", after {first['ended_s']:.1f} s" if from_start else ""  # else the times count from the first report
        waited = f" in a collective, waiting for a call rank {origin['rank']} never made" if origin is not None else ""
        parts.append(f"rank {first['rank']} {_ending(first)} first{after}{waited}")
        parts += [
            f"rank {r['rank']} {r['why']}"
            for r in rows
            if r is not first and r is not origin and r["why"] != "finished" and r["status"] != UNREPORTED
        ]
        if silent:
            parts.append(f"{_ranks(silent)} wrote no OOM report (no OOM, or stopped before writing)")
    elif any(r.get("stopped") for r in rows):
        parts.append("no rank failed, and the job did not end: " + "; ".join(f"rank {r['rank']} {r['why']}" for r in rows))
    elif all(r["status"] == "ok" for r in rows):
        parts.append(f"all {len(rows)} ranks finished")
    else:
        parts += [f"rank {r['rank']} {r['ending']}" for r in rows if r["status"] != "ok"]
    if mismatch and origin is None:
        parts.append(f"the ranks made different collective calls ({mismatch['text']}): their collectives no longer pair up")
    elif len(waits) > 1:
        parts.append("the ranks wait at different calls: they no longer run the same collectives in the same order")
    if differences:
        parts.append("they differ in " + ", ".join(dict.fromkeys(d["label"] for d in differences)))
    elif len(rows) > 1 and compared(rows):  # ranks killed before they reported have no figures to call alike
        parts.append("their memory is alike")
    hints = [
        f"rank {r['rank']} asked for a GPU this machine does not have: with NCCL every rank needs a GPU of its own; "
        "with gloo, ranks can share one (keep every rank on cuda:0)"
        for r in rows
        if "invalid device ordinal" in str(r.get("message", "")).lower()
    ]
    if first is not None and first.get("signal") in SIGNAL_HINTS:
        hint = f"rank {first['rank']} was killed by {first['signal']}: {SIGNAL_HINTS[first['signal']]}"
        if said := last_words(first.get("stderr") or ""):
            hint += f". Its last words: {said}"
        hints.append(hint)
    return {
        "tool": TOOL,
        "of": tool,
        "hints": hints,
        "world_size": len(rows),
        "kind": "failed" if first else ("hung" if any(r.get("stopped") for r in rows) else "finished"),
        "headline": "; ".join(parts) + ".",
        "first_failure": first["rank"] if first else None,
        "out_of_step": origin["rank"] if origin is not None else None,
        "desynchronised": desynchronised,
        "collective_mismatch": mismatch,
        "differences": differences,
        "ranks": rows,
    }
