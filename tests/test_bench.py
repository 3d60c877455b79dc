"""``speed.json`` is built an exercise or a few at a time: merging keeps each row's own sitting."""

from __future__ import annotations

from oomlab.bench import merge


def row(ex_id: str, created: str, recheck: float = 1.0, check_over: float = 1.0, diagnose: float = 1.5) -> dict:
    return {
        "id": ex_id,
        "created": created,
        "recheck_warm_s": recheck,
        "check_cold_minus_plain_s": check_over,
        "diagnose_vs_plain_bug": diagnose,
    }


def test_rows_timed_now_replace_theirs_and_the_others_keep_their_date():
    earlier = {"gpu": "H200", "exercises": [row("a", "monday"), row("b", "monday")]}
    now = {"gpu": "H200", "created": "tuesday", "exercises": [row("b", "tuesday", recheck=0.9), row("c", "tuesday")]}
    merged = merge(earlier, now)
    assert [(r["id"], r["created"]) for r in merged["exercises"]] == [("a", "monday"), ("b", "tuesday"), ("c", "tuesday")]
    assert merged["created"] == "tuesday"
    assert merged["targets"] == {
        "recheck_warm_under_2_s": True,
        "check_cold_within_plain_plus_1_5_s": True,
        "diagnose_within_2x_plain": True,
    }


def test_a_target_missed_by_any_row_is_missed_and_verify_keeps_its_own_sitting():
    earlier = {"verify_wall_s": 26.8, "verify_created": "monday", "exercises": [row("a", "monday", recheck=2.5)]}
    merged = merge(earlier, {"created": "tuesday", "exercises": [row("b", "tuesday", diagnose=2.4)]})
    assert merged["verify_created"] == "monday"
    assert merged["targets"] == {
        "recheck_warm_under_2_s": False,
        "check_cold_within_plain_plus_1_5_s": True,
        "diagnose_within_2x_plain": False,
        "verify_under_30_s": True,
    }
    assert merge(None, {"exercises": [row("a", "x")]})["exercises"][0]["id"] == "a"


def test_a_script_row_counts_towards_the_diagnose_target_and_scripts_merge_like_exercises():
    script = {"id": "long_history.py", "created": "monday", "diagnose_vs_plain": 2.5}
    merged = merge({"exercises": [row("a", "monday")]}, {"created": "monday", "scripts": [script]})
    assert merged["targets"]["diagnose_within_2x_plain"] is False
    again = merge(merged, {"created": "tuesday", "scripts": [{**script, "created": "tuesday", "diagnose_vs_plain": 1.4}]})
    assert [r["created"] for r in again["scripts"]] == ["tuesday"] and again["targets"]["diagnose_within_2x_plain"] is True
    assert [r["id"] for r in again["exercises"]] == ["a"]
