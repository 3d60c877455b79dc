"""The committed reports describe the course and the code as they are now, and hold nothing of the machine that wrote them."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from oomlab.course import Course
from oomlab.grading.truth import all_runs, fingerprint, source_digest

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
        elif rows[ex.id].get("sources") != source_digest(ex):
            stale.append(f"{ex.id}'s manifest, script or reference fix changed since")
    known = {ex.id for ex in Course(REPO, working_tree=True).exercises}
    stale += [f"it lists {ex_id}, which the course no longer has" for ex_id in rows if ex_id not in known]
    assert not stale, f"{VERIFY.relative_to(REPO)} is stale: " + "; ".join(stale) + f". {REGENERATE}"


def test_verify_json_says_every_run_behaved_as_its_exercise_says():
    report = json.loads(VERIFY.read_text(encoding="utf-8"))
    wrong = [f"{row['id']}: {run['name']}" for row in report["exercises"] for run in all_runs(row) if not run["as_expected"]]
    assert report["ok"] and not wrong, f"runs not as expected: {wrong}"
    assert all(row["cheats"] for row in report["exercises"]), "every exercise is tried with the generic cheats"


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

    Not every run is bit-equal both ways: kernels whose sums are not deterministic
    (scaled_dot_product_attention's backward) move a loss in its last bits, and runs
    that fail under memory pressure can end with other final figures or another retry
    count. The site lists those runs; none may change a verdict, and none may be a run
    the course expects to pass.
    """
    table = json.loads(EQUIVALENCE.read_text(encoding="utf-8"))
    assert table["code"] == fingerprint(), (
        f"{EQUIVALENCE.relative_to(REPO)} is older than the measuring code: run `make equivalence` on a GPU and commit it."
    )
    verified = json.loads(VERIFY.read_text(encoding="utf-8"))
    expected = {(row["id"], run["name"]) for row in verified["exercises"] for run in all_runs(row)}
    expected |= {(row["id"], "reference") for row in verified["exercises"]}
    compared = [(row["exercise"], row["run"]) for row in table["rows"]]
    assert sorted(compared) == sorted(expected), "the table and verify.json must cover the same runs"
    assert table["runs"] == len(compared)
    assert {(row["fresh"]["runner"], row["forked"]["runner"]) for row in table["rows"]} == {("fresh", "forked")}
    other_verdict = [f"{r['exercise']} {r['run']}" for r in table["rows"] if r["fresh"]["verdict"] != r["forked"]["verdict"]]
    assert not other_verdict, f"a forked run got another verdict than a fresh one: {other_verdict}"
    passing = [r for r in table["rows"] if r["kind"] in ("reference", "solution", "alternative")]
    other_figures = [
        f"{r['exercise']} {r['run']}: {r['stats_differ']}"
        for r in passing
        if not r["stats_equal"] or any(r["fresh"][k] != r["forked"][k] for k in ("status", "oom"))
    ]
    assert not other_figures, f"a fix measured other allocator figures forked than fresh: {other_figures}"
    assert table["all_equal"] == all(r["equal"] for r in table["rows"])
