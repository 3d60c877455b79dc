"""``speed.json`` is built an exercise or a few at a time: merging keeps each row's own sitting."""

from __future__ import annotations

import pytest

from oomlab.bench import merge


def row(
    ex_id: str, created: str, recheck: float = 1.0, check_over: float = 1.0, diagnose: float = 1.5, check: float = 7.0
) -> dict:
    return {
        "id": ex_id,
        "created": created,
        "check_cold_s": check,
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
        "check_under_15_s": True,
    }


def test_a_target_missed_by_any_row_is_missed_and_verify_keeps_its_own_sitting():
    earlier = {
        "verify_wall_s": 206.8,
        "verify_vs_floor": 1.18,
        "verify_created": "monday",
        "exercises": [row("a", "monday", recheck=2.5)],
    }
    merged = merge(earlier, {"created": "tuesday", "exercises": [row("b", "tuesday", diagnose=2.4)]})
    assert merged["verify_created"] == "monday"
    assert merged["targets"] == {
        "recheck_warm_under_2_s": False,
        "check_cold_within_plain_plus_1_5_s": True,
        "diagnose_within_2x_plain": False,
        "verify_within_1_2x_floor": True,
        "check_under_15_s": True,
    }
    assert merge(None, {"exercises": [row("a", "x")]})["exercises"][0]["id"] == "a"
    again = merge({**earlier, "verify_slots_held": 0.5}, {"verify_wall_s": 190.0, "verify_vs_floor": 1.1})
    assert "verify_slots_held" not in again and "verify_created" not in again, "a new verify sitting keeps no old figure"


def test_a_script_row_counts_towards_the_diagnose_target_and_scripts_merge_like_exercises():
    script = {"id": "long_history.py", "created": "monday", "diagnose_vs_plain": 2.5}
    merged = merge({"exercises": [row("a", "monday")]}, {"created": "monday", "scripts": [script]})
    assert merged["targets"]["diagnose_within_2x_plain"] is False
    again = merge(merged, {"created": "tuesday", "scripts": [{**script, "created": "tuesday", "diagnose_vs_plain": 1.4}]})
    assert [r["created"] for r in again["scripts"]] == ["tuesday"] and again["targets"]["diagnose_within_2x_plain"] is True
    assert [r["id"] for r in again["exercises"]] == ["a"]


def test_a_checks_only_sitting_caches_every_reference_then_times_first_checks_with_no_server_then_kept_ones(
    monkeypatch, tmp_path
):
    import oomlab.bench as bench
    from oomlab.measure import keeper

    servers: set[str] = set()  # the allocator settings whose server a keeper holds
    calls: list[tuple[str, str]] = []

    def timed(args, cwd, env):
        option, ex_id = args[4:]
        assert option == "--keep-warm" or not servers, "a first check is timed with no server anywhere"
        calls.append((option, ex_id))
        if option == "--keep-warm":
            servers.add(by_id[ex_id].conf)
        return 2.0 if servers else 10.0

    monkeypatch.setattr(bench, "timed", timed)
    monkeypatch.setattr(bench.warm.WarmServer, "find", lambda root, conf: conf in servers or None)
    monkeypatch.setattr(keeper, "stop_keepers", lambda root: servers.clear())
    exercises = []
    for ex_id, conf in (("a", ""), ("b", ""), ("c", "expandable_segments:True")):
        folder = tmp_path / "exercises" / ex_id
        folder.mkdir(parents=True)
        (folder / "train.py").write_text(f"# the bug of {ex_id}\n", encoding="utf-8")
        (tmp_path / f"{ex_id}-fix.py").write_text(f"# the fix of {ex_id}\n", encoding="utf-8")
        exercises.append(
            type(
                "Ex",
                (),
                {
                    "id": ex_id,
                    "alloc_conf": conf,
                    "conf": conf,
                    "file": "train.py",
                    "budget_bytes": 1,
                    "long_check": "",
                    "is_estimate": False,
                    "solution_path": tmp_path / f"{ex_id}-fix.py",
                },
            )()
        )
    by_id = {ex.id: ex for ex in exercises}
    rows = list(bench.checks_sitting(tmp_path, exercises, 3, lambda _: None))

    assert sorted(calls[:3]) == [("--no-keep-warm", i) for i in "abc"], "every reference is cached first"
    assert calls[3:6] == [("--no-keep-warm", i) for i in "abc"], "then one first check each"
    assert calls[6:] == [("--keep-warm", "a")] * 4 + [("--keep-warm", "b")] * 3 + [("--keep-warm", "c")] * 4
    assert [r["id"] for r in rows] == list("abcabc")
    assert rows[-1] == {"id": "c", "budget_bytes": 1, "says_why": False, "check_cold_s": 10.0, "check_kept_s": 2.0}
    assert not servers, "the keepers are stopped after"
    assert all((tmp_path / "exercises" / i / "train.py").read_text() == f"# the bug of {i}\n" for i in "abc")


def test_an_estimate_exercise_is_timed_by_checks_of_its_reference_estimator_and_its_file_is_put_back(monkeypatch, tmp_path):
    import oomlab.bench as bench

    folder = tmp_path / "exercises" / "size-it"
    folder.mkdir(parents=True)
    learner = folder / "estimate.py"
    learner.write_text("# the shipped estimator\n", encoding="utf-8")
    (tmp_path / "reference.py").write_text("# the reference estimator\n", encoding="utf-8")
    seen: list[str] = []

    def timed(args, cwd, env):
        assert args[3:] == ["check", "size-it"] and cwd == tmp_path
        seen.append(learner.read_text(encoding="utf-8"))
        return {1: 9.0, 2: 7.0, 3: 8.0}[len(seen)]

    monkeypatch.setattr(bench, "timed", timed)
    ex = type(
        "Ex",
        (),
        {
            "id": "size-it",
            "file": "estimate.py",
            "budget_bytes": None,
            "long_check": "",
            "is_estimate": True,
            "solution_path": tmp_path / "reference.py",
        },
    )()
    row = bench.estimate_checks(tmp_path, ex, 3, lambda _: None)

    assert seen == ["# the reference estimator\n"] * 3, "each check grades the reference estimator"
    assert row == {"id": "size-it", "budget_bytes": None, "says_why": True, "check_cold_s": 8.0}
    assert learner.read_text(encoding="utf-8") == "# the shipped estimator\n"
    assert bench.targets({"exercises": [], "checks": [row]})["check_under_15_s"]


def test_a_checks_only_row_leaves_the_exercises_other_figures_and_the_latest_timing_of_a_check_counts():
    from oomlab.bench import check_rows
    from oomlab.site.measurements_page import check_table

    whole = {**row("a", "2026-12-01"), "check_cold_s": 7.6}
    merged = merge(
        {"exercises": [whole]},
        {"created": "2026-12-04", "checks": [{"id": "a", "created": "2026-12-04", "check_cold_s": 16.0, "check_kept_s": 20.5}]},
    )
    assert merged["exercises"] == [whole], "the whole sitting's figures stay"
    assert check_rows(merged)["a"]["check_kept_s"] == 20.5 and merged["targets"]["check_under_15_s"] is False
    later = merge(merged, {"created": "2026-12-05", "exercises": [{**whole, "created": "2026-12-05", "check_kept_s": 3.0}]})
    assert check_rows(later)["a"]["check_kept_s"] == 3.0 and later["targets"]["check_under_15_s"] is True
    (line,) = [line for line in check_table(merged) if line.startswith("| a |")]
    assert "| 16.0 | 20.5 |" in line and "2026-12-04" in line


def test_a_checks_only_row_counts_towards_the_check_target_alone():
    merged = merge(
        {"exercises": [row("a", "monday")]}, {"created": "tuesday", "exercises": [{"id": "slow", "check_cold_s": 34.2}]}
    )
    assert merged["targets"] == {
        "recheck_warm_under_2_s": True,
        "check_cold_within_plain_plus_1_5_s": True,
        "diagnose_within_2x_plain": True,
        "check_under_15_s": False,
    }


def test_a_check_longer_than_a_learner_waits_meets_the_target_only_where_its_page_says_why():
    slow = {"id": "inference-worker", "check_cold_s": 38.0}
    assert merge(None, {"exercises": [{**slow, "says_why": False}]})["targets"]["check_under_15_s"] is False
    assert merge(None, {"exercises": [{**slow, "says_why": True}]})["targets"]["check_under_15_s"] is True
    assert merge(None, {"exercises": [{"id": "a", "check_cold_s": 15.0}]})["targets"]["check_under_15_s"] is True


def test_the_verify_row_says_how_near_its_floor_the_truth_check_ran():
    from oomlab.bench import verify_row

    def run(wall):
        return {"wall_s": wall}

    report = {
        "runs": 5,
        "jobs": 2,
        "exercises": [
            {"solution": run(4.0), "buggy": run(30.0), "wrong_fixes": [run(2.0)], "alternatives": [], "cheats": [run(None)]},
            {"solution": run(1.0), "buggy": run(1.0), "cheats": []},
        ],
    }
    row = verify_row(report, 36.0)
    # runs 4 + 30 + 2 + 0 + 1 + 1, and the references at their fixes' 4 + 1: 43 s over 2 slots is 21.5 s < the 30 s run
    assert (row["verify_runs_sum_s"], row["verify_longest_run_s"], row["verify_floor_s"]) == (43.0, 30.0, 30.0)
    assert row["verify_vs_floor"] == 1.2 and row["verify_parallel"] == 2
    assert verify_row({**report, "jobs": 1}, 43.0)["verify_floor_s"] == 43.0, "one slot: the floor is the sum"
    assert "verify_slots_held" not in row, "a report that does not say when its tasks ran says nothing of them"

    # When each task ran, seconds into the sitting: the eight tasks held 40 + 2 + 10 + 35 + 4 and 2 + 2 + 1 = 96 s
    # of the 2 slots' 2 x 50 s, 53 s of it outside their scripts' own 43 s; the first started at 1 s, the last ended at 45 s.
    spans = iter([[5, 45], [10, 12], [12, 22], [5, 40], [1, 5], [22, 24], [24, 26], [5, 6]])
    for ex in report["exercises"]:
        for r in ex["cheats"] + ex.get("wrong_fixes", []) + [ex["solution"], ex["buggy"]] + ex.get("alternatives", []):
            r["task_s"] = next(spans)
        ex["reference_task_s"] = next(spans)
    timed = verify_row(report, 50.0)
    assert (timed["verify_tasks_sum_s"], timed["verify_outside_runs_s"], timed["verify_slots_held"]) == (96.0, 53.0, 0.96)
    assert (timed["verify_first_start_s"], timed["verify_last_end_s"]) == (1.0, 45.0)
    assert "verify_run_parts_s" not in timed, "no witness timed a part of a run"

    # Where a run's task went: the witness saw each process start its script at ready_s and end at process_s.
    ex = report["exercises"][0]
    ex["cheats"][0].update(wall_s=1.0, witness={"ready_s": 0.5, "process_s": 3.0})  # its task: 5 to 45 s
    ex["solution"]["witness"] = {"ready_s": 0.5, "process_s": 5.0}  # its task: 12 to 22 s, its script 4 s
    parts = verify_row(report, 50.0)["verify_run_parts_s"]
    # starts 0.5 and 0.5; scripts 1 and 4; ends 3 - 0.5 - 1 and 5 - 0.5 - 4; the parent's 40 - 3 and 10 - 5
    assert parts == {"start": 0.5, "script": 2.5, "end": 1.0, "parent": 21.0}


# --------------------------------------------------------------------------- the tools' own costs on the site


def variant(step_ms: float, host: int | None = None, peak_reserved: int = 0) -> dict:
    return {"median_step_ms": step_ms, "p90_step_ms": step_ms + 0.5, "host_growth_bytes": host, "peak_reserved": peak_reserved}


OOM_HOOK_ROW = {
    "steps": 300,
    "repeat": 3,
    "max_entries": 100_000,
    "loops": {
        "transformer": {
            "plain": variant(20.0),
            "history_off": variant(19.96),
            "history_on": variant(20.08, host=50 * 2**20),
            "overhead": {"history_off": -0.002, "history_on": 0.004},
            "history_gpu_bytes": {"peak_allocated": 0, "peak_reserved": 2 * 2**20},
        }
    },
    "at_oom": {
        "report_s": 0.9,
        "oom_propagated": True,
        "files": ["a", "b"],
        "snapshot_bytes": 3 * 2**20,
        "report_bytes": 4 * 2**20,
    },
}


def test_the_oom_hooks_cost_reads_each_loops_step_times_and_the_reports_own():
    from oomlab.site.tool_costs import oom_hook_section

    md = "\n".join(oom_hook_section(OOM_HOOK_ROW, "NVIDIA H200, torch 2.11"))
    assert "300 optimizer steps each, run 3 times" in md and "at most 100,000 entries" in md
    assert "| 20.00 ms (p90 20.50) | 19.96 ms (p90 20.46), -0.2% | 20.08 ms (p90 20.58), +0.4% | 50.0 MiB | 2.0 MiB |" in md
    assert "took 0.90 s (4.0 MiB in 2 files, of which 3.0 MiB the snapshot), and the same `OutOfMemoryError`" in md
    lost = {**OOM_HOOK_ROW, "at_oom": {**OOM_HOOK_ROW["at_oom"], "oom_propagated": False}}
    assert "was not the OOM" in "\n".join(oom_hook_section(lost, "?"))
    assert oom_hook_section(None, "?") == []


def test_the_big_snapshot_row_shows_each_phase_and_the_peak_memory():
    from oomlab.site.tool_costs import big_snapshot_section

    row = {
        "source": "cuda", "depth": 32, "events": 2_400_000, "segments": 5_000, "pickle_bytes": 300 * 10**6,
        "load_s": 8.2, "analyze_s": 2.94, "render_s": 0.1, "draw_s": 1.0, "peak_rss_bytes": 2**30, "result_json_bytes": 2**20,
    }  # fmt: skip
    md = "\n".join(big_snapshot_section(row, "NVIDIA H200, torch 2.11"))
    assert "2,400,000 history events and 5,000 segments (286.1 MiB pickled), recorded on NVIDIA H200" in md
    assert "| 8.2 s | 2.9 s | 0.1 s | 1.0 s | 1,024.0 MiB | 1.0 MiB of JSON |" in md
    assert "Of the peak" not in md, "without the figure before reading, no share is said"
    md = "\n".join(big_snapshot_section({**row, "rss_after": {"imports": 2**29}}, "?"))
    assert "Of the peak, 512.0 MiB is the process before it read anything" in md and "took 512.0 MiB." in md
    assert "built to torch's format" in "\n".join(big_snapshot_section({**row, "source": "synthetic"}, "?"))
    assert big_snapshot_section(None, "?") == []


# --------------------------------------------------------------------------- what the witness costs


def test_the_witness_bench_alternates_runs_with_and_without_the_driver_and_reports_medians(monkeypatch):
    import contextlib

    from oomlab.bench import witness as bench
    from oomlab.measure import harness

    asked = []

    def fake_measure(script, **kwargs):  # the real measure_exercise_file passes its keywords on to this
        asked.append(kwargs["witness_driver"])
        driver = {"samples": 40, "sample_s_mean": 0.001, "sample_s_max": 0.004} if kwargs["witness_driver"] else {}
        witness = {"driver": driver, "process_s": 2.0, "supervisor_cpu_s": 0.2}
        wall = 1.1 if kwargs["witness_driver"] else 1.0
        return harness.Measurement(script=str(script), status="ok", wall_s=wall, witness=witness, runner="forked")

    monkeypatch.setattr(harness, "measure", fake_measure)
    monkeypatch.setattr(bench.warm, "serving", lambda *a, **k: contextlib.nullcontext([]))
    report = bench.measure(["reference-cycle"], 2)
    assert asked == [True, False, True, False]
    row = report["exercises"]["reference-cycle"]
    assert (row["with"]["samples"], row["with"]["sample_ms_max"], row["without"]["samples"]) == (40, 4.0, None)
    assert row["script_wall_overhead"] == 0.1 and report["interval_s"] == bench.INTERVAL_S


def test_the_measurements_page_says_how_the_truth_checks_slots_were_spent_only_where_the_sitting_timed_its_tasks():
    from oomlab.site.measurements_page import speed_section

    sitting = {
        "gpu": "G",
        "torch": "T",
        "exercises": [],
        "scripts": [],
        "targets": {},
        "verify_wall_s": 50.0,
        "verify_runs": 8,
        "verify_parallel": 2,
        "verify_floor_s": 30.0,
        "verify_longest_run_s": 30.0,
        "verify_runs_sum_s": 43.0,
        "verify_vs_floor": 1.67,
    }
    plain = "\n".join(speed_section(sitting, {"runs": 8}))
    assert "1.67 times that" in plain and "slots' time" not in plain and "sittings" not in plain
    in_two = "\n".join(speed_section({**sitting, "verify_sittings": 2}, {"runs": 8}))
    assert "2 at a time, in 2 sittings, their times added up" in in_two
    timed = {**sitting, "verify_slots_held": 0.96, "verify_outside_runs_s": 53.0, "verify_first_start_s": 1.0}
    text = "\n".join(speed_section(timed, {"runs": 8}))
    assert "held 96% of the slots' time; 53.0 s" in text and "began 1.0 s in" in text and "A typical run" not in text
    parts = {"start": 0.5, "script": 2.5, "end": 1.0, "parent": 21.0}
    text = "\n".join(speed_section({**timed, "verify_run_parts_s": parts}, {"runs": 8}))
    assert "0.5 s from its process's start to its script's, 2.5 s of script, 1.0 s from the script's end" in text


def test_a_learners_check_is_the_one_after_the_first_where_that_was_timed_and_a_long_one_must_say_why():
    from dataclasses import replace

    from mkdocs.exceptions import PluginError

    from oomlab.course import Course
    from oomlab.site.exercise_page import check_time_row
    from oomlab.site.reports import Reports

    ex = replace(Course().get("eval-graphs"), long_check="")
    first_only = {"id": ex.id, "gpu": "G", "torch": "T", "check_cold_s": 18.0}
    kept = {**first_only, "check_kept_s": 3.2}
    assert merge(None, {"exercises": [kept]})["targets"]["check_under_15_s"] is True
    assert merge(None, {"exercises": [first_only]})["targets"]["check_under_15_s"] is False
    assert merge(None, {"exercises": [{**first_only, "says_why": True}]})["targets"]["check_under_15_s"] is True

    (line,) = check_time_row(ex, Reports([ex], speed={"exercises": [kept]}))
    assert "3.2 s on G, torch T" in line and "the first check of a sitting, which imports torch: 18.0 s" in line
    with pytest.raises(PluginError, match="18.0 s here, more than 15 s: say why"):
        check_time_row(ex, Reports([ex], speed={"exercises": [first_only]}))
    (line,) = check_time_row(replace(ex, long_check="It trains for an hour."), Reports([ex], speed={"exercises": [first_only]}))
    assert "18.0 s" in line and "Longer than most: It trains for an hour." in line
    assert check_time_row(ex, Reports([ex], speed={"exercises": []})) == []


def test_check_times_are_first_checks_in_fresh_processes_then_checks_forked_from_the_server_the_last_one_left(
    monkeypatch, tmp_path
):
    import oomlab.bench as bench
    from oomlab.measure import keeper

    calls, found, stopped = [], iter([None, None, object()]), []
    monkeypatch.setattr(bench, "timed", lambda args, cwd, env: calls.append(args[4:]) or float(len(calls)))
    asked = []
    monkeypatch.setattr(
        bench.warm.WarmServer, "find", lambda root, conf: asked.append(conf) or next(found)
    )  # ready at the third look
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    monkeypatch.setattr(keeper, "stop_keepers", lambda root: stopped.append(root))
    ex = type("Ex", (), {"id": "eval-graphs", "alloc_conf": "", "file": "train.py"})()
    (tmp_path / "exercises" / ex.id).mkdir(parents=True)
    (tmp_path / "exercises" / ex.id / "train.py").write_text("import torch\n", encoding="utf-8")
    cold, kept = bench.check_times(tmp_path, ex, 3, {})
    assert calls == [["--no-keep-warm", "eval-graphs"]] * 2 + [["--keep-warm", "eval-graphs"]] * 4
    assert (cold, kept) == ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) and stopped == [tmp_path], "the keeper is stopped after"
    assert asked == ["", "", ""]

    # A fix that sets its own allocator settings at its top runs with them: the kept server is the one for those.
    script = 'import os\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"\nimport torch\n'
    (tmp_path / "exercises" / ex.id / "train.py").write_text(script, encoding="utf-8")
    found, asked[:] = iter([object()]), []
    bench.check_times(tmp_path, ex, 3, {})
    assert asked == ["expandable_segments:True"]


def test_oomlab_dev_bench_prints_its_table_where_mkdocs_is_not_installed(tmp_path):
    """The GPU machine that runs the bench has no site toolchain: the bench's command must not need it."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(
        f"""
        import sys
        sys.modules["mkdocs"] = None  # `import mkdocs` now fails, as where it is not installed
        import oomlab.bench
        sitting = {{"gpu": "G", "torch": "T", "created": "today", "repeat": 3}}
        row = {{"id": "eval-graphs", "check_cold_s": 12.5, "check_kept_s": 2.9, **sitting}}
        oomlab.bench.bench = lambda *args, **kwargs: iter([{{**sitting, "exercises": [row]}}])
        from oomlab.cli import app
        sys.argv = ["oomlab", "dev", "bench", "--checks-only", "--no-scripts", "--no-verify", "--json", {str(tmp_path / "speed.json")!r}]
        app()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "200"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "eval-graphs" in done.stdout and "2.90" in done.stdout and "12.50" in done.stdout


def test_a_truth_check_measured_in_sittings_is_judged_by_the_sum_of_their_times():
    """`oomlab dev bench --verify-measured verify.json` takes the row from a report written by verify or equivalence in
    sittings: its wall time is the sittings' sum, set against the floor of all its runs together."""
    from oomlab.bench import measured_verify_row, merge

    def run(wall):
        return {"wall_s": wall}

    report = {
        "gpu": "G",
        "torch": "T",
        "created": "today",
        "runs": 6,
        "jobs": 2,
        "wall_s": 30.0 + 25.0,  # two sittings
        "sittings": 2,
        "exercises": [
            {"solution": run(10.0), "buggy": run(20.0), "cheats": [run(10.0)]},
            {"solution": run(10.0), "buggy": run(20.0), "cheats": [run(10.0)]},
        ],
    }
    row = measured_verify_row(report)
    # runs 10 + 20 + 10 twice, and the references at their fixes' 10 twice: 100 s over 2 slots, a floor of 50 s
    assert (row["verify_wall_s"], row["verify_floor_s"], row["verify_vs_floor"]) == (55.0, 50.0, 1.1)
    assert row["verify_sittings"] == 2 and row["verify_created"] == "today" and row["gpu"] == "G"
    assert merge(None, row)["targets"]["verify_within_1_2x_floor"] is True
    slow = measured_verify_row({**report, "wall_s": 70.0})
    assert merge(None, slow)["targets"]["verify_within_1_2x_floor"] is False


def test_a_verify_report_that_is_not_there_is_one_clear_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "other.json").write_text("[1, 2]", encoding="utf-8")
    for name in ("missing.json", "other.json"):
        done = subprocess.run(
            [sys.executable, "-m", "oomlab", "dev", "bench", "--no-exercises", "--no-scripts", "--json", str(tmp_path / "speed.json"),
             "--verify-measured", str(tmp_path / name)],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], env={**__import__("os").environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is not a truth check's report" in done.stdout + done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "speed.json").exists(), "nothing written"


def test_an_estimates_check_time_is_shown_with_why_it_is_long_and_counts_as_said():
    """An estimate's check measures its hidden configs afresh each time: its page says so beside the time, and the
    bench's target counts it as said, where a script exercise without a long_check fails both."""
    import oomlab.bench as bench
    from oomlab.course import Course
    from oomlab.site.estimate_page import estimate_page
    from oomlab.site.reports import Reports

    ex = Course(working_tree=True).get("size-a-decoder")
    row = {"id": ex.id, "gpu": "G", "torch": "T", "check_cold_s": 31.4, **bench.row_of(ex)}
    assert row["says_why"] is True and merge(None, {"checks": [row]})["targets"]["check_under_15_s"] is True
    page = estimate_page(ex, 1, 1, Reports([ex], speed={"checks": [row]}))
    (line,) = [line for line in page.splitlines() if line.startswith("| `oomlab check` takes |")]
    assert "31.4 s on G, torch T, grading the reference estimator" in line
    assert "Longer than most: every check measures its 6 hidden configs on the GPU, a whole greedy generation" in line
    assert "| `oomlab check` takes" not in estimate_page(ex, 1, 1, Reports([ex], speed={}))
