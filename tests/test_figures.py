"""What ``oomlab dev figures`` keeps of a tool run's allocator snapshot."""

from oomlab.site.figures import SNAPSHOT_LIMIT_BYTES, keep_snapshot


def test_a_snapshot_small_enough_to_download_is_copied(tmp_path):
    snapshot = tmp_path / "snapshot.pickle"
    snapshot.write_bytes(b"x" * 1000)
    kept, left_out = keep_snapshot(snapshot, tmp_path / "ex-bug-snapshot.pickle")
    assert kept == "ex-bug-snapshot.pickle" and left_out is None
    assert (tmp_path / kept).read_bytes() == snapshot.read_bytes()


def test_a_snapshot_too_large_to_ship_is_left_out_with_its_size_and_an_old_copy_removed(tmp_path):
    snapshot = tmp_path / "snapshot.pickle"
    snapshot.write_bytes(b"x" * (SNAPSHOT_LIMIT_BYTES + 1))
    old = tmp_path / "ex-bug-snapshot.pickle"
    old.write_bytes(b"from an earlier run")
    kept, left_out = keep_snapshot(snapshot, old)
    assert kept is None and "over the 5.0 MiB" in left_out
    assert not old.exists()


# --------------------------------------------------------------------------- the bug and the fix compared


def side(label: str, ended: str, site_bytes: int, holder_bytes: int) -> dict:
    """A side as ``side_from_run`` makes it, with the run's own folders in it."""
    from oomlab.units import MIB

    return {
        "label": label,
        "source": "run",
        "path": f"/home/someone/course/.oomlab/figures/{label}/snapshot",
        "ended": ended,
        "headline": f"{label}'s snapshot",
        "figures": {"allocated": site_bytes + 40 * MIB, "reserved": site_bytes + 64 * MIB, "segments": 3, "peak_allocated": None},
        "peak_source": "allocator",
        "sites": [
            {
                "label": "train.py:31",
                "file": "/home/someone/course/exercises/x/train.py",
                "line": 31,
                "function": "<module>",
                "code": "features.append(encoder(x))",
                "bytes": site_bytes,
                "blocks": 4,
            },
            {
                "label": "train.py:9",
                "file": "/home/someone/course/exercises/x/train.py",
                "line": 9,
                "function": "<module>",
                "code": "model = Net().cuda()",
                "bytes": 40 * MIB,
                "blocks": 2,
            },
        ],
        "sites_complete": True,
        "holders": [
            {
                "name": "global 'features' (train.py:12)",
                "what": "global 'features'",
                "bytes": holder_bytes,
                "label": "culprit",
                "largest_path": "features[3]",
            }
        ],
        "holders_complete": True,
        "notes": [],
    }


def compared() -> dict:
    from oomlab.tools.compare.analysis import compare
    from oomlab.units import MIB

    return compare(side("ex", "OOM at train.py:31", 800 * MIB, 800 * MIB), side("ex-fix", "finished", 0, 0), top=5)


def test_what_the_site_keeps_of_a_comparison_names_no_folder_of_the_machine():
    import json

    from oomlab.tools.compare.analysis import shareable

    kept = shareable(compared())
    text = json.dumps(kept)
    assert "/home/someone" not in text
    assert kept["kind"] == "shrank" and kept["shrunk"][0]["code"] == "features.append(encoder(x))"
    assert kept["holders"][0]["growth"] < 0 and kept["sides"]["b"]["ended"] == "finished"


def test_what_the_site_keeps_of_a_comparison_is_every_part_with_the_compare_tools_own_keys():
    """figures.json keeps the keys the compare tool lists (SHAREABLE_KEYS), each part of the result with its own."""
    from oomlab.tools.compare.analysis import SHAREABLE_KEYS, shareable

    whole = compared()
    kept = shareable(whole, holders=1)
    assert list(kept) == [*SHAREABLE_KEYS["result"], "sides", "figures", "grown", "shrunk", "holders"]
    assert all(list(side) == list(SHAREABLE_KEYS["side"]) for side in kept["sides"].values())
    assert kept["figures"] and all(list(f) == list(SHAREABLE_KEYS["figure"]) for f in kept["figures"])
    assert kept["shrunk"] and all(list(r) == list(SHAREABLE_KEYS["site"]) for r in kept["grown"] + kept["shrunk"])
    assert kept["holders"] and all(list(h) == list(SHAREABLE_KEYS["holder"]) for h in kept["holders"])
    assert shareable(whole, holders=0)["holders"] == [] and len(shareable(whole)["holders"]) == len(whole["holders"])


def test_the_compare_fold_shows_the_figures_the_lines_the_holders_and_the_picture():
    from oomlab.site.compare_fold import COMPARE_FOLD, compare_fold
    from oomlab.tools.compare.analysis import shareable

    entry = {**shareable(compared()), "files": ["ex-compare.png"]}
    md = "\n".join(compare_fold(entry, "ex", "solutions/ex/train.py", "exercises/ex.md", "NVIDIA H200, torch 2.11, 2026-12-02"))
    assert md.startswith(f'??? abstract "{COMPARE_FOLD}"')
    body = [line for line in md.split("\n")[1:] if line]
    assert all(line.startswith("    ") for line in body), "everything is inside the fold"
    assert "`oomlab compare ex solutions/ex/train.py`" in md and "(OOM at train.py:31)" in md
    assert "| allocated (in live blocks (tensors)) | 840.0 MiB | 40.0 MiB | -800.0 MiB |" in md
    assert "| segments (cudaMalloc'd segments the allocator holds) | 3 | 3 | +0 |" in md
    assert "peak allocated" not in md, "a figure neither side has is left out"
    assert "| train.py:31 | `features.append(encoder(x))` | 800.0 MiB | 0 B | -800.0 MiB |" in md
    assert "global 'features'" in md and "Grew most" not in md
    assert "](../figures/ex-compare.png)" in md


def test_an_exercise_without_a_comparison_gets_no_fold():
    from oomlab.site.compare_fold import compare_fold

    assert compare_fold(None, "ex", "solutions/ex/train.py", "exercises/ex.md", "?") == []


# --------------------------------------------------------------------------- the failed step, from the tool's figures


def failed_step(live: int, request: int | None, peak: int) -> str:
    """The exercise page's note on a profiled bug's failed step, for the first profiled exercise of the course."""
    from pathlib import Path

    from oomlab.course import Course
    from oomlab.site.exercise_page import failed_step_note
    from oomlab.site.reports import Reports

    ex = next(ex for ex in Course(Path(__file__).resolve().parents[1], working_tree=True).exercises if ex.step == "profile")
    reports = Reports(exercises=[ex], verify={"exercises": [{"id": ex.id, "buggy": {"peak_allocated": peak}}]})
    figure = {"tool": "profile", "headline": "words that say nothing", "failure": {"live_bytes": live, "request_bytes": request}}
    return "\n".join(failed_step_note(ex, figure, reports))


def test_the_failed_step_note_reads_the_tools_figures_in_any_unit_not_its_headline():
    from oomlab.units import KIB, MIB

    note = failed_step(300 * MIB, 512 * KIB, 300 * MIB)
    assert (
        "The headline's 300.0 MiB is what was live in the step that failed, when it asked for 512.0 KiB more: 300.5 MiB" in note
    )
    assert "earlier moment" not in note, "the run's peak is the failed step's"
    assert "The table's peak allocated for the buggy script, 400.0 MiB," in failed_step(300 * MIB, 512 * KIB, 400 * MIB)


def test_a_failed_step_without_a_request_gets_no_note():
    from oomlab.units import MIB

    assert failed_step(300 * MIB, None, 300 * MIB) == ""


# --------------------------------------------------------------------------- the whole command, with runs faked


def test_regenerate_draws_each_exercises_tool_and_compares_its_bug_with_its_fix(course_copy, tmp_path, monkeypatch):
    """`oomlab dev figures` end to end where a GPU would run the tools: every run asked for, every file listed."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from oomlab.course import Course
    from oomlab.site import figures
    from oomlab.units import KIB, MIB

    runs = []

    def run_tool(target, name, out_dir, options):
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        side = "fix" if "solutions" in str(target.script) else "bug"
        runs.append((target.label, side, name, options))
        live = (100 if side == "fix" else 900) * MIB
        result = {"tool": name, "kind": f"{name}-{side}", "headline": f"{name} on the {side}", "out_dir": str(out_dir)}
        result["run"] = {"status": "ok" if side == "fix" else "oom", "where": "train.py:31"}
        if name == "snapshot":
            owners = [{"site": "train.py:31", "file": "train.py", "line": 31, "function": "<module>", "code": "keep.append(x)",
                       "bytes": live, "blocks": 3}]  # fmt: skip
            result.update(totals={"allocated": live, "reserved": 2 * live, "non_releasable": 0, "segments": 3}, owners=owners)
        if name == "hunt":
            result["holders"] = [{"name": "global 'keep' (train.py:12)", "what": "list `keep` (global)", "bytes": live}]
        if name == "profile" and side == "bug":
            result["failure"] = {"time_ms": 12.5, "live_bytes": live, "request_bytes": 512 * KIB}
        return SimpleNamespace(gpu="NVIDIA H200", torch="2.11", wall_s=1.0), result

    class Pictures:
        def __init__(self, name):
            self.name = name

        def draw(self, result, out_dir):
            picture = Path(out_dir) / f"{self.name}.png"
            picture.write_bytes(b"png")
            return [picture]

    monkeypatch.setattr(figures, "run_tool", run_tool)
    monkeypatch.setattr(figures, "presenter", Pictures)
    course = Course(course_copy, working_tree=True)
    out = tmp_path / "figures"
    written = figures.regenerate(course, out, jobs=4)  # an estimate runs nothing to draw: the scripts' figures

    index = json.loads((out / "figures.json").read_text())
    assert set(index["figures"]) == {f"{ex.id}-{v}" for ex in course.scripts for v in ("bug", "fix")}
    assert any(f["failure"] for f in index["figures"].values()), "no exercise is profiled: the failure is not tested"
    assert set(index["compares"]) == {ex.id for ex in course.scripts}
    for ex in course.scripts:
        wanted = {ex.step, "snapshot", "hunt"}
        for side in ("bug", "fix"):
            asked = {name: options for label, s, name, options in runs if label == ex.id and s == side}
            assert set(asked) == wanted, (ex.id, side, asked)  # the exercise's own tool once, even when it is one of the two
            assert asked[ex.step] == figures.step(ex.step).figure_options
            figure = index["figures"][f"{ex.id}-{side}"]
            assert figure["tool"] == ex.step and figure["headline"] == f"{ex.step} on the {side}"
            profiled_failure = {"time_ms": 12.5, "live_bytes": 900 * MIB, "request_bytes": 512 * KIB}
            assert figure["failure"] == (profiled_failure if (ex.step, side) == ("profile", "bug") else None), (ex.id, side)
            assert figure["files"] == [f"{ex.id}-{side}-{ex.step}.png"] and (out / figure["files"][0]).is_file()
        compared = index["compares"][ex.id]
        assert compared["kind"] == "shrank" and compared["shrunk"][0]["growth"] == -800 * MIB
        assert compared["sides"]["b"]["ended"] == "finished" and compared["holders"][0]["growth"] == -800 * MIB
        assert compared["files"] == [f"{ex.id}-compare.png"] and (out / f"{ex.id}-compare.png").is_file()
    assert set(written) == {*(p for p in out.iterdir())}, "every file written is returned, figures.json last"
    assert str(tmp_path) not in (out / "figures.json").read_text()

    # One exercise redrawn: only its tools run, and the others' entries stay as they were, in course order.
    runs.clear()
    first, last = course.scripts[0], course.scripts[-1]
    before = json.loads((out / "figures.json").read_text())
    before["figures"][f"{first.id}-bug"]["headline"] = "drawn earlier"
    before["figures"]["gone-bug"] = {**before["figures"][f"{first.id}-bug"], "exercise": "gone"}
    (out / "figures.json").write_text(json.dumps(before))
    written = figures.regenerate(course, out, jobs=2, only=[last.id])
    assert {label for label, *_ in runs} == {last.id}
    index = json.loads((out / "figures.json").read_text())
    assert list(index["figures"]) == [f"{ex.id}-{v}" for ex in course.scripts for v in ("bug", "fix")]
    assert list(index["compares"]) == [ex.id for ex in course.scripts]
    assert index["figures"][f"{first.id}-bug"]["headline"] == "drawn earlier", "another exercise's entry is kept"
    assert index["figures"][f"{last.id}-bug"]["headline"] == f"{last.step} on the bug"
    assert all(path.name.startswith((last.id, "figures.json")) for path in written)
