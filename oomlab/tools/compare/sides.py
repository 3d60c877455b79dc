"""Where each side of ``oomlab compare`` comes from: a snapshot file, a tool's result, or a fresh run.

:func:`prepare` reads one argument. It is, in this order:

- a folder: one the snapshot tool wrote (``.oomlab/runs/ID-snapshot/``), or
  ``diagnose``'s, with ``snapshot/`` in it;
- a ``.json`` file: the ``snapshot.json`` the snapshot tool wrote; its
  ``snapshot.pickle``, where it lies beside it, gives every allocation site,
  and the JSON alone the largest;
- any other file but a ``.py``: a pickled snapshot, ``oomlab snapshot``'s or
  ``torch.cuda.memory._dump_snapshot()``'s;
- else a run target: an exercise id, a script, or a script and its arguments
  in one quoted word (``"train.py --batch 64"``). :func:`prepare` returns the
  :class:`~oomlab.tools.run.Target` and the caller runs the snapshot and hunt
  tools on it; :func:`side_from_run` reads what they found.

A script that is an exercise's own file (its ``train.py`` under ``exercises/``,
or the reference fix under ``solutions/``) runs under that exercise's budget and
allocator settings, as the exercise id would: ``compare ID solutions/ID/train.py``
then compares the bug with its fix under the same cap.

A side read from files is hunted too when a ``hunt.json`` lies where oomlab
writes one: beside the snapshot, in ``../hunt/`` (diagnose's folders), or in
``../ID-hunt/`` beside ``ID-snapshot/``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

from oomlab.course import Course, find_root
from oomlab.course.state import NAME, read_error, shown
from oomlab.errors import OomLabError
from oomlab.tools.compare.analysis import figures_of, live_sites
from oomlab.tools.hunt.analysis import TOP_HOLDERS
from oomlab.tools.run import Target, close_files, exercise_target, path_kind, resolve
from oomlab.tools.snapshot.analysis import analyze, load_snapshot

__all__ = ["label_of", "prepare", "read_side", "run_target", "side_from_run"]

SNAPSHOT_FILES = ("snapshot.json", "snapshot.pickle", "snapshot/snapshot.json", "snapshot/snapshot.pickle")
WHAT_TO_GIVE = (
    "Give two of: a snapshot.pickle (oomlab snapshot, or torch.cuda.memory._dump_snapshot()), "
    "a snapshot.json, a folder oomlab snapshot or oomlab diagnose wrote, an exercise id, or a script."
)


def prepare(word: str, budget: str | None = None, time_limit_s: float | None = None) -> dict | Target:
    """One argument of ``compare``: a side read from its file(s) now, or the :class:`Target` to run for it."""
    path = Path(word)
    kind = path_kind(path)
    if kind == "folder":
        return read_side(_snapshot_in(path), label_of(path))
    if kind == "file" and path.suffix != ".py":
        return read_side(path)
    if kind == "missing" and path.suffix in (".pickle", ".pkl", ".json"):
        raise OomLabError(f"No snapshot at {shown(path)}.", f"{close_files(path, '*' + path.suffix)}{WHAT_TO_GIVE}")
    words = [word]
    if kind == "missing" and len(word.split()) > 1:  # "train.py --batch 64": a script and its arguments
        try:
            words = shlex.split(word)
        except ValueError as err:
            raise OomLabError(f"Cannot read {shown(word)} as a script and its arguments: {err}.", WHAT_TO_GIVE) from None
    return run_target(words, budget, time_limit_s)


def run_target(words: list[str], budget: str | None = None, time_limit_s: float | None = None) -> Target:
    """:func:`~oomlab.tools.run.resolve`, except that an exercise's own file runs under its exercise's settings."""
    target = resolve(words, budget, time_limit_s)
    if target.ranks:
        raise OomLabError(
            "compare sets two runs of one process side by side, and a torchrun job is one run per rank.",
            f"Snapshot the job (`oomlab snapshot {' '.join(words)}`), then compare two of its ranks: "
            "oomlab compare OUT/rank0/snapshot.pickle OUT/rank1/snapshot.pickle",
        )
    if target.exercise is not None or target.args:
        return target
    try:
        course = Course(find_root(target.script.parent), strict=False)
    except OomLabError:  # a script outside any course
        return target
    for ex in course.exercises:
        for file, label in ((ex.learner_path, ex.id), (ex.solution_path, f"{ex.id}-fix")):
            if file.resolve() == target.script:
                own = exercise_target(ex, target.budget_bytes, time_limit_s, script=target.script, shown_as=target.script)
                return dataclasses.replace(own, label=label)
    return target


def label_of(path: Path) -> str:
    """A short name for a snapshot: its file's name, or its folder's where the name is the tool's own (``snapshot``)."""
    path = Path(path).absolute()
    names = [path.stem if path.is_file() else path.name, *(folder.name for folder in path.parents)]
    return next((n for n in names if n and n != "snapshot"), "snapshot").removesuffix("-snapshot")


def _snapshot_in(folder: Path) -> Path:
    for name in SNAPSHOT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise OomLabError(f"{shown(folder)} is a folder with no snapshot.json or snapshot.pickle in it.", WHAT_TO_GIVE)


# --------------------------------------------------------------------------- sides from files


def read_side(path: Path, label: str | None = None) -> dict:
    """The side a snapshot file gives: a ``snapshot.json`` result (with its pickle if beside it), or a pickle."""
    path = Path(path)
    root = _root_of(path)
    if path.suffix == ".json":
        result = _read_result(path)
        side = _side_of_result(result, path.parent, root)
    else:
        snapshot = load_snapshot(path)
        result = analyze(snapshot)
        side = _side(result, live_sites(snapshot, root=str(root)), True)
    holders, complete, note = _hunt_beside(path.parent)
    side.update(
        label=label or label_of(path),
        source="result" if path.suffix == ".json" else "pickle",
        path=str(path),
        ended="OOM recorded" if result["oom"].get("failed_request") is not None else "no OOM recorded",
        holders=holders,
        holders_complete=complete,
    )
    if note:
        side["notes"].append(note)
    return side


def _root_of(path: Path) -> Path:
    """The folder a shared snapshot's relative file names start from: the one holding ``.oomlab/`` above it.

    Failing that, the course folder, or the current one.
    """
    path = Path(path).absolute()
    for folder in path.parents:
        if folder.name == NAME:
            return folder.parent
    try:
        return find_root(path.parent)
    except OomLabError:
        return Path.cwd()


def _read_json(path: Path, what: str):
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise read_error(path, err, what) from None
    except UnicodeDecodeError:
        raise OomLabError(f"{shown(path)} is not a text file, so not a tool's JSON result.", WHAT_TO_GIVE) from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise OomLabError(f"{shown(path)} is not valid JSON ({err}).", WHAT_TO_GIVE) from None


def _read_result(path: Path) -> dict:
    """A ``snapshot.json``, checked: the snapshot tool's, not failed, with its totals."""
    result = _read_json(path, "the snapshot result")
    tool = result.get("tool") if isinstance(result, dict) else None
    if tool != "snapshot":
        what = f"the {tool} tool's result" if isinstance(tool, str) else f"a JSON {type(result).__name__}"
        raise OomLabError(f"{shown(path)} is not a snapshot result: it is {what}.", WHAT_TO_GIVE)
    if result.get("kind") == "error":
        raise OomLabError(
            f"{shown(path)} records a snapshot that failed: {result.get('error')}.", "Take the snapshot again (oomlab snapshot)."
        )
    totals = result.get("totals")
    if not isinstance(totals, dict) or not all(isinstance(totals.get(k), int) for k in ("allocated", "reserved")):
        raise OomLabError(f"{shown(path)} has no totals of a snapshot in it.", "Take the snapshot again (oomlab snapshot).")
    result.setdefault("oom", {})
    return result


def _side_of_result(result: dict, folder: Path, root: Path, script: str | None = None) -> dict:
    """A side from a snapshot result: every site from its pickle when that is there, else the sites it lists."""
    owners = [o for o in result.get("owners") or [] if isinstance(o, dict)]
    pickle_path = folder / result["snapshot_file"] if isinstance(result.get("snapshot_file"), str) else None
    if pickle_path is not None and pickle_path.is_file():
        # The code each listed site had when the snapshot was taken: the file may have changed since.
        known = {o["site"]: o["code"] for o in owners if o.get("code") and isinstance(o.get("site"), str)}
        return _side(result, live_sites(load_snapshot(pickle_path), script, str(root), known), True)
    sites = [
        {
            "label": o.get("site") or o.get("label"),
            **{k: o.get(k) for k in ("file", "line", "function")},
            "code": o.get("code") or "",
            "bytes": int(o.get("bytes") or 0),
            "blocks": int(o.get("blocks") or 0),
        }
        for o in owners
    ]
    return _side(result, sites, not result.get("owners_left_out"))


def _side(result: dict, sites: list[dict], complete: bool) -> dict:
    figures, peak_source = figures_of(result)
    return {
        "headline": result.get("headline", ""),
        "figures": figures,
        "peak_source": peak_source,
        "sites": sites,
        "sites_complete": complete,
        "notes": [],
    }


def _hunt_beside(folder: Path) -> tuple[list | None, bool, str]:
    """The holders of a ``hunt.json`` where oomlab puts one for this snapshot's folder; (None, True, why not) if none."""
    folder = Path(folder).absolute()
    candidates = [folder / "hunt.json"]
    if folder.name == "snapshot":
        candidates.append(folder.parent / "hunt" / "hunt.json")
    elif folder.name.endswith("-snapshot"):
        candidates.append(folder.parent / (folder.name.removesuffix("-snapshot") + "-hunt") / "hunt.json")
    for path in candidates:
        if not path.is_file():
            continue
        try:
            result = _read_json(path, "the hunt result")
        except OomLabError as err:
            return None, True, f"{err.what} Holders are not compared."
        holders, why = _holders_of(result)
        if holders is None:
            return None, True, f"{shown(path)}: {why}; holders are not compared."
        return holders, len(holders) < TOP_HOLDERS, ""
    return None, True, ""


def _holders_of(result) -> tuple[list | None, str]:
    """A hunt result's holders, checked; (None, why) when it is not a hunt's, failed, or is in an unknown format."""
    if not isinstance(result, dict) or result.get("tool") != "hunt":
        return None, "not a hunt result"
    if result.get("kind") == "error":
        return None, f"the hunt failed ({result.get('error')})"
    holders = result.get("holders")
    ok = isinstance(holders, list) and all(
        isinstance(h, dict) and isinstance(h.get("name"), str) and isinstance(h.get("bytes"), int) for h in holders
    )
    return (holders, "") if ok else (None, "its holders are in a format this tool does not know")


# --------------------------------------------------------------------------- sides from runs


def side_from_run(target: Target, snapshot: dict, hunt: dict | None) -> dict:
    """The side a run gives: the snapshot tool's result (``run_tool``'s, with ``out_dir``) and, if run, the hunt's."""
    if snapshot.get("kind") == "error":
        raise OomLabError(
            f"The snapshot tool failed on {target.label}: {snapshot.get('error')}.",
            f"Run `oomlab snapshot {target.label}` to see it alone; `oomlab doctor` says what this machine lacks.",
        )
    side = _side_of_result(snapshot, Path(snapshot["out_dir"]), target.root or target.script.parent, str(target.script))
    run = snapshot.get("run") or {}
    where = f" at {run['where']}" if run.get("where") else ""
    holders = None
    if hunt is not None:
        holders, why = _holders_of(hunt)
        if holders is None:
            side["notes"].append(f"{why}; holders are not compared.")
    side.update(
        label=target.label,
        source="run",
        path=snapshot["out_dir"],
        ended="finished" if run.get("status") == "ok" else f"{'OOM' if run.get('status') == 'oom' else run.get('status')}{where}",
        holders=holders,
        holders_complete=holders is None or len(holders) < TOP_HOLDERS,
    )
    return side
