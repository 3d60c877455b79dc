"""The committed reports describe the course and the code as they are now, and hold nothing of the machine that wrote them."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from oomlab.course import Course
from oomlab.grading.equivalence import defects
from oomlab.grading.truth import all_runs, fingerprint
from oomlab.grading.truth import stale as stale_row

REPO = Path(__file__).resolve().parents[1]
VERIFY = REPO / "course" / "measurements" / "verify.json"
FIGURES = REPO / "course" / "figures"
REGENERATE = "Run `make verify` on a GPU (oomlab dev verify) and commit what it writes."


def test_verify_json_is_not_older_than_the_course_or_the_code_it_describes():
    report = json.loads(VERIFY.read_text(encoding="utf-8"))
    rows = {row["id"]: row for row in report["exercises"]}
    stale = []
    if report.get("code") != fingerprint():
        stale.append("the measuring or grading code (oomlab/measure, oom.py, frames.py, checks, cheats) changed since")
    for ex in Course(REPO, working_tree=True).exercises:
        if ex.id not in rows:
            stale.append(f"{ex.id} is not in it")
        elif why := stale_row(rows[ex.id], ex):
            stale.append(f"{ex.id}: {why}")
    known = {ex.id for ex in Course(REPO, working_tree=True).exercises}
    stale += [f"it lists {ex_id}, which the course no longer has" for ex_id in rows if ex_id not in known]
    assert not stale, f"{VERIFY.relative_to(REPO)} is stale: " + "; ".join(stale) + f". {REGENERATE}"


def test_verify_json_says_every_run_behaved_as_its_exercise_says():
    report = json.loads(VERIFY.read_text(encoding="utf-8"))
    wrong = [f"{row['id']}: {run['name']}" for row in report["exercises"] for run in all_runs(row) if not run["as_expected"]]
    assert report["ok"] and not wrong, f"runs not as expected: {wrong}"
    scripts = [row for row in report["exercises"] if row.get("kind") != "estimate"]  # an estimator has no cheats to try
    assert all(row["cheats"] for row in scripts), "every script exercise is tried with the generic cheats"


def frame_files(snapshot: dict) -> set[str]:
    files = set()
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            files.update(f["filename"] for f in block.get("frames") or [])
    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            files.update(f["filename"] for f in entry.get("frames") or [])
    return files


def test_committed_snapshots_name_files_relative_to_the_course():
    pickles = sorted(FIGURES.glob("*.pickle"))
    assert pickles, "the site offers allocator snapshots"
    for path in pickles:
        files = frame_files(pickle.loads(path.read_bytes()))
        absolute = sorted(f for f in files if f.startswith("/") or ":\\" in f)
        assert not absolute, f"{path.name} names files of the machine that wrote it: {absolute[:3]}"
        assert any(f.startswith(("exercises/", "solutions/")) for f in files), f"{path.name} never names the exercise's script"


EQUIVALENCE = REPO / "course" / "measurements" / "equivalence.json"


def test_equivalence_json_compares_every_run_of_the_course_fresh_and_forked_and_finds_the_same_grades():
    """Forked from a warm server or fresh, a run gets the same verdict, and a run that must pass the same figures.

    Not every run is bit-equal both ways (oomlab.grading.equivalence says which may not be); the site
    lists those runs, and none may be a defect of the server.
    """
    table = json.loads(EQUIVALENCE.read_text(encoding="utf-8"))
    assert table["code"] == fingerprint(), (
        f"{EQUIVALENCE.relative_to(REPO)} is older than the measuring code: run `make equivalence` on a GPU and commit it."
    )
    verified = json.loads(VERIFY.read_text(encoding="utf-8"))
    scripts = [row for row in verified["exercises"] if row.get("kind") != "estimate"]  # an estimate runs nothing to fork
    expected = {(row["id"], run["name"]) for row in scripts for run in all_runs(row)}
    expected |= {(row["id"], "reference") for row in scripts}
    compared = [(row["exercise"], row["run"]) for row in table["rows"]]
    assert sorted(compared) == sorted(expected), "the table and verify.json must cover the same runs"
    assert table["runs"] == len(compared)
    assert {(row["fresh"]["runner"], row["forked"]["runner"]) for row in table["rows"]} == {("fresh", "forked")}
    assert not defects(table), "a forked run got another verdict than a fresh one, or a fix other figures"
    assert table["all_equal"] == all(r["equal"] for r in table["rows"])


def test_a_defect_of_the_server_is_another_verdict_or_a_fix_measured_otherwise_and_nothing_else():
    def row(kind, verdicts=("fail", "fail"), differ=None, status=("oom", "oom")):
        side = lambda i: {"verdict": verdicts[i], "status": status[i], "oom": status[i] == "oom"}  # noqa: E731
        return {
            "exercise": "x",
            "run": kind,
            "kind": kind,
            "fresh": side(0),
            "forked": side(1),
            "stats_equal": not differ,
            "stats_differ": differ or {},
            "equal": False,
        }

    cheat_elsewhere = row("cheat", differ={"inactive_split_peak": [1, 2]})  # a failing run's last figures: no defect
    assert defects({"rows": [cheat_elsewhere]}) == []
    assert defects({"rows": [row("cheat", verdicts=("fail", "pass"))]}) == ["x cheat: verdict fail fresh, pass forked"]
    fix = row("solution", ("pass", "pass"), {"peak_allocated": [1, 2]}, ("ok", "ok"))
    assert defects({"rows": [fix]}) == ["x solution: {'peak_allocated': [1, 2]}"]
    assert defects({"rows": [row("alternative", ("pass", "pass"), None, ("ok", "timeout"))]}), "a fix that timed out forked"
