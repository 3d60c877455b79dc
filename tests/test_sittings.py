"""A report measured in sittings keeps only rows a full sitting would write now, in course order."""

from __future__ import annotations

from types import SimpleNamespace

from oomlab.grading import sittings

SAME = {"code": "c1", "gpu": "H200", "torch": "2.11", "jobs": 15, "runner": "forked"}


def run(ok: bool = True) -> dict:
    return {"as_expected": ok}


def row(ex_id: str, sources: str = "s", ok: bool = True) -> dict:
    return {"id": ex_id, "sources": sources, "solution": run(ok), "buggy": run(), "cheats": [run()]}


def report(rows: list[dict], wall: float, **over) -> dict:
    return dict(SAME, exercises=rows, wall_s=wall, runs=0, ok=True, **over)


def course(monkeypatch, sources: dict[str, str]) -> list:
    from oomlab.grading import truth

    monkeypatch.setattr(truth, "source_digest", lambda ex: sources[ex.id])
    return [SimpleNamespace(id=i, is_estimate=False) for i in sources]


def test_a_sitting_of_one_exercise_keeps_the_others_in_course_order_and_adds_the_wall_time(monkeypatch):
    exercises = course(monkeypatch, {"a": "s", "b": "s", "c": "s"})
    old = report([row("a"), row("b"), row("c")], 100.0)
    merged, dropped = sittings.merge_verify(old, report([row("b", ok=False)], 20.0), exercises)
    assert [r["id"] for r in merged["exercises"]] == ["a", "b", "c"]
    assert merged["exercises"][1]["solution"]["as_expected"] is False  # the new row, not the old one
    assert (merged["wall_s"], merged["sittings"], merged["runs"], merged["ok"]) == (120.0, 2, 12, False)
    assert dropped == []


def test_rows_of_other_code_another_gpu_or_changed_sources_are_dropped_and_named(monkeypatch):
    exercises = course(monkeypatch, {"a": "s", "b": "new", "c": "s"})
    new = report([row("c")], 20.0)
    merged, dropped = sittings.merge_verify(report([row("a"), row("b")], 100.0), new, exercises)
    assert [r["id"] for r in merged["exercises"]] == ["a", "c"]
    assert dropped == ["b: its manifest, script or reference fix changed since"]
    for key, other in (("code", "c0"), ("gpu", "A100"), ("jobs", 8)):
        merged, dropped = sittings.merge_verify(report([row("a")], 100.0, **{key: other}), new, exercises)
        assert [r["id"] for r in merged["exercises"]] == ["c"] and merged["sittings"] == 1 and merged["wall_s"] == 20.0
        assert dropped == [f"a: measured with another {key}"]


def test_an_exercise_the_course_no_longer_has_is_dropped(monkeypatch):
    exercises = course(monkeypatch, {"a": "s"})
    merged, dropped = sittings.merge_verify(report([row("gone")], 5.0), report([row("a")], 1.0), exercises)
    assert [r["id"] for r in merged["exercises"]] == ["a"] and dropped == ["gone: no longer in the course"]


def test_equivalence_rows_stay_only_where_their_verify_rows_stayed():
    exercises = [SimpleNamespace(id=i) for i in ("a", "b")]
    eq = lambda ex, equal=True: {"exercise": ex, "run": "bug", "equal": equal}  # noqa: E731
    old = dict(SAME, rows=[eq("a"), eq("b")], fresh_wall_s=10.0, forked_wall_s=5.0)
    new = dict(SAME, rows=[eq("b", False)], fresh_wall_s=1.0, forked_wall_s=1.0)
    merged, _ = sittings.merge_equivalence(old, new, exercises, kept_in_verify={"a", "b"})
    assert [r["exercise"] for r in merged["rows"]] == ["a", "b"] and merged["all_equal"] is False
    assert (merged["fresh_wall_s"], merged["forked_wall_s"], merged["runs"]) == (11.0, 6.0, 2)
    merged, dropped = sittings.merge_equivalence(old, new, exercises, kept_in_verify={"b"})
    assert [r["exercise"] for r in merged["rows"]] == ["b"] and dropped == ["a: its rows in verify.json were dropped"]


def test_a_sitting_of_some_exercises_runs_as_many_at_once_as_the_report_it_joins_unless_told(tmp_path, monkeypatch):
    """Without --jobs, a sitting of some exercises takes the committed report's parallelism: at any other it could keep
    none of the report's rows. A whole sitting, or a report that says nothing of it, asks the machine."""
    import json

    from oomlab.cli import dev

    monkeypatch.setattr(dev, "auto_jobs", lambda course: 7)
    committed = tmp_path / "verify.json"
    committed.write_text(json.dumps(report([row("a")], 10.0)), encoding="utf-8")
    assert dev.sitting_jobs(None, 0, ["a"], committed) == SAME["jobs"]
    assert dev.sitting_jobs(None, 4, ["a"], committed) == 4
    assert dev.sitting_jobs(None, 0, None, committed) == 7
    assert dev.sitting_jobs(None, 0, ["a"], tmp_path / "none.json") == 7
    committed.write_text("{not json", encoding="utf-8")
    assert dev.sitting_jobs(None, 0, ["a"], committed) == 7


def test_an_estimate_row_graded_with_other_sizing_code_is_dropped_and_counts_no_reference(monkeypatch):
    from oomlab.grading import truth

    exercises = course(monkeypatch, {"a": "s", "size": "s"})
    exercises[1].is_estimate = True
    monkeypatch.setattr(truth, "estimate_fingerprint", lambda: "sizing-now")
    estimate = lambda code: dict(row("size"), kind="estimate", code=code, cheats=[])  # noqa: E731
    merged, dropped = sittings.merge_verify(report([row("a"), estimate("sizing-then")], 100.0), report([], 1.0), exercises)
    assert [r["id"] for r in merged["exercises"]] == ["a"]
    assert dropped == ["size: the sizing code it was graded with changed since"]
    merged, _ = sittings.merge_verify(report([row("a"), estimate("sizing-now")], 100.0), report([], 1.0), exercises)
    assert merged["runs"] == 4 + 2, "a script's three runs and its reference; an estimate's two runs and no reference"
