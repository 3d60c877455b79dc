"""``oomlab compare`` on synthetic snapshots: the pairing of sites across different code, the result, the CLI.

The bug and its fix are two versions of one small script: the fix allocates its
cache whole before the loop, so its lines below that point moved down by one
and the cache's site is another line. Snapshots are built the way
tests/test_tool_snapshot.py builds them (keys and frame order of
``torch.cuda.memory._snapshot()``); runs are faked where a GPU would measure.
"""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest

from oomlab.measure.harness import CHILD, Measurement
from oomlab.tools.compare import analysis, present, sides
from oomlab.tools.hunt.analysis import summarize
from oomlab.tools.snapshot.analysis import analyze, load_snapshot, normalize
from oomlab.tools.snapshot.probe import write_snapshot_pickle
from oomlab.units import MIB
from tests.in_process import oomlab
from tests.test_tool_hunt import holder
from tests.test_tool_snapshot import Builder, block

BUG = textwrap.dedent(
    """\
    import torch

    def encode(x):
        return x * 2

    weights = torch.randn(1024, device="cuda")
    cache = []
    for _ in range(4):
        x = torch.randn(256, device="cuda")
        cache.append(encode(x))
    """
)
FIX = textwrap.dedent(
    """\
    import torch

    def encode(x):
        return x * 2

    weights = torch.randn(1024, device="cuda")
    # the cache is allocated whole, before the loop
    cache = torch.empty(4, 256, device="cuda")
    for i in range(4):
        x = torch.randn(256, device="cuda")
        cache[i] = encode(x)
    """
)


def stack(script: Path, *lines: tuple[int, str]) -> list[dict]:
    """Frames innermost first: the script's ``(line, function)`` given, then runpy and the harness."""
    frames = [{"name": name, "filename": str(script), "line": line} for line, name in lines]
    return frames + [
        {"name": "_run_code", "filename": "<frozen runpy>", "line": 88},
        {"name": "run", "filename": str(CHILD), "line": 98},
    ]


def bug_snapshot(script: Path) -> dict:
    """At the OOM: weights (line 6), four 20 MiB cache entries made in encode() (line 4), the last x (line 9)."""
    b = Builder()
    b.segment([block(40 * MIB, stack=stack(script, (6, "<module>")))])
    for _ in range(4):
        b.segment([block(20 * MIB, stack=stack(script, (4, "encode"), (10, "<module>"))), block(12 * MIB, "inactive")])
    b.segment([block(2 * MIB, stack=stack(script, (9, "<module>")))], pool="small")
    b.segment([block(4 * MIB, stack=[])])  # the autograd engine's: no Python stack
    b.event("oom", 32 * MIB, device_free=1 << 30, stack=stack(script, (4, "encode"), (10, "<module>")))
    return b.snapshot()


def fix_snapshot(script: Path) -> dict:
    """At the end: the same weights, the cache in one block (line 8), x (line 10, was 9), more backward memory."""
    b = Builder()
    b.segment([block(40 * MIB, stack=stack(script, (6, "<module>")))])
    b.segment([block(80 * MIB, stack=stack(script, (8, "<module>")))])
    b.segment([block(2 * MIB, stack=stack(script, (10, "<module>")))], pool="small")
    b.segment([block(6 * MIB, stack=[])])
    return b.snapshot()


@pytest.fixture
def scripts(tmp_path) -> tuple[Path, Path]:
    bug, fix = tmp_path / "exercises" / "demo" / "train.py", tmp_path / "solutions" / "demo" / "train.py"
    for path, text in ((bug, BUG), (fix, FIX)):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    return bug, fix


def side(snapshot: dict, label: str, script: Path | None = None) -> dict:
    """A side as :mod:`oomlab.tools.compare.sides` builds one from a pickle."""
    snapshot = normalize(snapshot)
    figures, peak_source = analysis.figures_of(analyze(snapshot))
    sites = analysis.live_sites(snapshot, str(script) if script else None)
    return {
        "label": label,
        "source": "pickle",
        "ended": "",
        "headline": "",
        "figures": figures,
        "peak_source": peak_source,
        "sites": sites,
        "sites_complete": True,
        "holders": None,
        "notes": [],
    }


# --------------------------------------------------------------------------- one side


def test_live_sites_add_up_every_live_block_by_line_with_its_code(scripts):
    bug, _ = scripts
    snapshot = normalize(bug_snapshot(bug))
    sites = analysis.live_sites(snapshot, str(bug))
    rows = [(s["label"], s["function"], s["code"], s["bytes"], s["blocks"]) for s in sites]
    assert rows == [
        ("no Python stack (backward pass or C++)", None, "", 4 * MIB, 1),
        ("train.py:4", "encode", "return x * 2", 80 * MIB, 4),
        ("train.py:6", "<module>", 'weights = torch.randn(1024, device="cuda")', 40 * MIB, 1),
        ("train.py:9", "<module>", 'x = torch.randn(256, device="cuda")', 2 * MIB, 1),
    ]
    assert sum(s["bytes"] for s in sites) == analyze(snapshot)["totals"]["allocated"]


def test_a_site_keeps_the_code_it_had_when_the_snapshot_was_taken(scripts):
    bug, _ = scripts
    snapshot = normalize(bug_snapshot(bug))
    sites = analysis.live_sites(snapshot, str(bug), known_code={"train.py:4": "return x + x"})
    assert next(s for s in sites if s["label"] == "train.py:4")["code"] == "return x + x"


def test_figures_take_the_allocators_peaks_over_the_historys(scripts):
    bug, _ = scripts
    result = analyze(bug_snapshot(bug))
    figures, source = analysis.figures_of(result)
    assert source == "history" and figures["peak_allocated"] == result["timeline"]["peak_allocated"]
    assert (figures["allocated"], figures["segments"]) == (126 * MIB, 7)
    figures, source = analysis.figures_of({**result, "allocator_stats": {"peak_allocated": 5, "peak_reserved": 9}})
    assert (source, figures["peak_allocated"], figures["peak_reserved"]) == ("allocator", 5, 9)
    no_history = {**result, "timeline": {"events": 0, "peak_allocated": 0}}
    assert analysis.figures_of(no_history)[0]["peak_allocated"] is None


# --------------------------------------------------------------------------- matching


def site(line, code="", function="f", file="/a/train.py", size=MIB):
    label = f"{Path(file).name}:{line}" if file else "no Python stack (backward pass or C++)"
    return {"label": label, "file": file, "line": line, "function": function, "code": code, "bytes": size, "blocks": 1}


def test_sites_match_by_line_text_across_folders_when_lines_moved():
    rows = analysis.match_sites(
        [site(9, "x = f(y)", file="/ex/demo/train.py")], [site(10, "x  =  f(y)", file="/sol/demo/train.py")]
    )
    assert [(r["site"], r["matched_by"], r["growth"]) for r in rows] == [("train.py:9 → train.py:10", "line text", 0)]


def test_the_same_text_twice_in_a_function_pairs_in_line_order():
    a = [site(12, "h = layer(h)", size=3 * MIB), site(5, "h = layer(h)", size=MIB)]
    b = [site(6, "h = layer(h)", size=2 * MIB), site(14, "h = layer(h)", size=7 * MIB)]
    rows = analysis.match_sites(a, b)
    assert [(r["site_a"], r["site_b"], r["growth"]) for r in rows] == [
        ("train.py:5", "train.py:6", MIB),
        ("train.py:12", "train.py:14", 4 * MIB),
    ]


def test_another_function_or_file_is_another_site():
    rows = analysis.match_sites([site(3, "return x", function="f")], [site(3, "return x", function="g")])
    assert sorted(r["matched_by"] for r in rows) == ["only in A", "only in B"]
    rows = analysis.match_sites([site(3, "return x", file="/a/model.py")], [site(3, "return x", file="/a/train.py")])
    assert sorted(r["matched_by"] for r in rows) == ["only in A", "only in B"]


def test_file_and_line_match_only_where_a_line_text_is_unknown():
    unknown = analysis.match_sites([site(7, "")], [site(7, "x = f(y)")])
    assert [(r["matched_by"], r["code"]) for r in unknown] == [("file and line", "x = f(y)")]
    differ = analysis.match_sites([site(7, "x = f(y)", size=MIB)], [site(7, "z = g(y)", size=2 * MIB)])
    assert sorted((r["matched_by"], r["growth"]) for r in differ) == [("only in A", -MIB), ("only in B", 2 * MIB)]


def test_allocations_with_no_python_frame_match_by_label():
    rows = analysis.match_sites([site(None, file=None, size=MIB)], [site(None, file=None, size=3 * MIB)])
    assert [(r["matched_by"], r["growth"]) for r in rows] == [("label", 2 * MIB)]


def test_holders_match_by_name_without_line():
    a = [
        holder("global 'cache'", "list", direct=80 * MIB, tensors=4),
        holder("main() local 'x' (train.py:9)", "Tensor", direct=2 * MIB),
    ]
    b = [holder("main() local 'x' (train.py:10)", "Tensor", direct=2 * MIB), holder("global 'model'", "Linear", state=MIB)]
    rows = analysis.match_holders(a, b)
    assert [(r["name"], r["bytes_a"], r["bytes_b"], r["growth"]) for r in rows] == [
        ("global 'model'", 0, MIB, MIB),
        ("main() local 'x'", 2 * MIB, 2 * MIB, 0),
        ("global 'cache'", 80 * MIB, 0, -80 * MIB),
    ]


# --------------------------------------------------------------------------- the result


def test_bug_against_fix_says_what_grew_and_what_shrank(scripts):
    bug, fix = scripts
    result = analysis.compare(side(bug_snapshot(bug), "bug", bug), side(fix_snapshot(fix), "fix", fix))
    assert result["kind"] == "grew"
    figures = {f["figure"]: (f["a"], f["b"], f["change"]) for f in result["figures"]}
    assert figures["allocated"] == (126 * MIB, 128 * MIB, 2 * MIB)
    assert figures["segments"] == (7, 4, -3)
    assert figures["non_releasable"] == (48 * MIB, 0, -48 * MIB)
    grown = [(r["site"], r["matched_by"], r["growth"]) for r in result["grown"]]
    shrunk = [(r["site"], r["matched_by"], r["growth"]) for r in result["shrunk"]]
    assert grown == [("train.py:8", "only in B", 80 * MIB), ("no Python stack (backward pass or C++)", "label", 2 * MIB)]
    assert shrunk == [("train.py:4", "only in A", -80 * MIB)]
    assert result["unchanged_sites"] == 2  # the weights, and x on its moved line
    changes = sum(r["growth"] for r in result["grown"] + result["shrunk"])
    assert changes == figures["allocated"][2]
    assert result["culprit_bytes"] == 80 * MIB
    assert result["holders"] is None
    json.dumps(result)


def test_the_headline_names_the_biggest_change_each_way(scripts):
    bug, fix = scripts
    a, b = side(bug_snapshot(bug), "bug", bug), side(fix_snapshot(fix), "fix", fix)
    grew = analysis.compare(a, b)["headline"]
    assert grew == (
        "B holds 2.0 MiB more live memory than A (126.0 MiB → 128.0 MiB); "
        'most grown: train.py:8 (cache = torch.empty(4, 256, device="cuda")) +80.0 MiB; '
        "most shrunk: train.py:4 (return x * 2) -80.0 MiB."
    )
    shrank = analysis.compare(b, a)["headline"]
    assert shrank.startswith("B holds 2.0 MiB less live memory than A (128.0 MiB → 126.0 MiB); most shrunk: train.py:8")


def test_the_same_snapshot_twice_changes_nothing(scripts):
    bug, _ = scripts
    result = analysis.compare(side(bug_snapshot(bug), "A", bug), side(bug_snapshot(bug), "B", bug))
    assert result["kind"] == "same" and result["grown"] == result["shrunk"] == [] and result["unchanged_sites"] == 4
    assert all(f["change"] == 0 for f in result["figures"])
    assert result["headline"] == "A and B hold the same live memory (126.0 MiB); no allocation site changed."


def test_top_bounds_each_list_and_counts_the_rest():
    a = {"figures": {"allocated": 0}, "sites": [], "label": "a"}
    b = {"figures": {"allocated": 6 * MIB}, "sites": [site(n, f"x{n} = f()", size=n * MIB) for n in range(1, 4)], "label": "b"}
    result = analysis.compare(a, b, top=2)
    assert [r["growth"] for r in result["grown"]] == [3 * MIB, 2 * MIB] and result["grown_left_out"] == 1


def test_holders_are_compared_only_when_both_sides_were_hunted(scripts):
    bug, fix = scripts
    a, b = side(bug_snapshot(bug), "bug", bug), side(fix_snapshot(fix), "fix", fix)
    a["holders"] = summarize([holder("global 'cache'", "list", direct=80 * MIB, tensors=4)])["holders"]
    assert analysis.compare(a, b)["holders"] is None
    assert "Only one side was hunted" in " ".join(analysis.compare(a, b)["notes"])
    b["holders"] = summarize([holder("global 'cache'", "Tensor", direct=80 * MIB, tensors=1, tensor_root=True)])["holders"]
    rows = analysis.compare(a, b)["holders"]
    assert [(r["holder"], r["bytes_a"], r["bytes_b"], r["growth"]) for r in rows] == [
        ("tensor `cache` (global)", 80 * MIB, 80 * MIB, 0)
    ]


def test_the_picture_and_the_tables_read_only_the_json(scripts, tmp_path):
    from rich.console import Console

    bug, fix = scripts
    result = json.loads(json.dumps(analysis.compare(side(bug_snapshot(bug), "bug", bug), side(fix_snapshot(fix), "fix", fix))))
    [png] = present.draw(result, tmp_path / "out")
    assert png.name == "compare.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = Console(width=200, record=True)
    for part in present.render(result):
        console.print(part)
    text = console.export_text()
    assert "Grew most" in text and "Shrank most" in text and "+80.0 MiB" in text and "-48.0 MiB" in text
    same = analysis.compare(side(bug_snapshot(bug), "A", bug), side(bug_snapshot(bug), "B", bug))
    assert present.draw(same, tmp_path / "same")[0].is_file()


# --------------------------------------------------------------------------- sides from files


def write_run(folder: Path, snapshot: dict, root: Path, script: Path, *, with_pickle=True) -> Path:
    """What `oomlab snapshot` leaves in ``folder``: snapshot.json, and the shareable pickle beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    result = analyze(snapshot, script=str(script))
    result["allocator_stats"] = {"peak_allocated": 200 * MIB, "peak_reserved": 300 * MIB}
    result["snapshot_file"] = "snapshot.pickle" if with_pickle else None
    if with_pickle:
        write_snapshot_pickle(snapshot, folder / "snapshot.pickle", str(root))
    (folder / "snapshot.json").write_text(json.dumps(result))
    return folder / "snapshot.json"


def test_a_shared_pickle_reads_its_code_under_the_folder_that_holds_oomlab(scripts, tmp_path, monkeypatch):
    bug, _ = scripts
    monkeypatch.chdir(tmp_path.parent)  # not the course: the names are found from the snapshot's own place
    path = write_run(tmp_path / ".oomlab" / "runs" / "demo-snapshot", bug_snapshot(bug), tmp_path, bug).with_name(
        "snapshot.pickle"
    )
    assert "exercises/demo/train.py" in {
        f["filename"] for s in load_snapshot(path)["segments"] for b in s["blocks"] for f in b["frames"]
    }
    got = sides.read_side(path)
    assert got["label"] == "demo" and got["source"] == "pickle" and got["ended"] == "OOM recorded"
    codes = {s["label"]: s["code"] for s in got["sites"]}
    assert codes["train.py:4"] == "return x * 2" and got["holders"] is None


def test_a_result_folder_gives_every_site_its_peaks_and_the_hunt_beside_it(scripts, tmp_path):
    bug, _ = scripts
    runs = tmp_path / ".oomlab" / "runs"
    write_run(runs / "demo-snapshot", bug_snapshot(bug), tmp_path, bug)
    hunt = summarize([holder("global 'cache'", "list", direct=80 * MIB, tensors=4)])
    (runs / "demo-hunt").mkdir()
    (runs / "demo-hunt" / "hunt.json").write_text(json.dumps(hunt))
    got = sides.prepare(str(runs / "demo-snapshot"))
    assert got["source"] == "result" and got["sites_complete"] and got["peak_source"] == "allocator"
    assert got["figures"]["peak_reserved"] == 300 * MIB
    assert sum(s["bytes"] for s in got["sites"]) == got["figures"]["allocated"]
    assert [h["name"] for h in got["holders"]] == ["global 'cache'"] and got["holders_complete"]


def test_a_result_without_its_pickle_lists_only_the_largest_sites(scripts, tmp_path):
    bug, fix = scripts
    path = write_run(tmp_path / "old", bug_snapshot(bug), tmp_path, bug, with_pickle=False)
    got = sides.read_side(path)
    assert got["sites_complete"]  # 4 sites: the JSON lists them all
    assert {s["label"] for s in got["sites"]} == {
        "train.py:4",
        "train.py:6",
        "train.py:9",
        "no Python stack (backward pass or C++)",
    }
    result = json.loads(path.read_text())
    result["owners_left_out"] = 3
    path.write_text(json.dumps(result))
    got = sides.read_side(path)
    assert not got["sites_complete"]
    notes = analysis.compare(got, side(fix_snapshot(fix), "fix", fix))["notes"]
    assert any(n.startswith("A's sites come from its result file") for n in notes)


def test_a_diagnose_folder_is_read_with_its_hunt(scripts, tmp_path):
    bug, _ = scripts
    base = tmp_path / "fc-diagnose"
    write_run(base / "snapshot", bug_snapshot(bug), tmp_path, bug)
    (base / "hunt").mkdir()
    (base / "hunt" / "hunt.json").write_text(json.dumps({"tool": "hunt", "kind": "error", "error": "boom"}))
    got = sides.prepare(str(base))
    assert got["label"] == "fc-diagnose" and got["holders"] is None
    assert got["notes"] == [f"{base / 'hunt' / 'hunt.json'}: the hunt failed (boom); holders are not compared."]


def test_an_exercises_own_files_run_under_its_settings(course_copy, monkeypatch):
    from oomlab.course import Course

    monkeypatch.chdir(course_copy)
    ex = Course(course_copy).get("feature-cache")
    fix = sides.prepare("solutions/feature-cache/train.py")
    assert (fix.label, fix.budget_bytes, fix.exercise.id) == ("feature-cache-fix", ex.budget_bytes, "feature-cache")
    assert fix.shown_as == {str(ex.solution_path.resolve()): "solutions/feature-cache/train.py"}
    bug = sides.prepare("exercises/feature-cache/train.py", budget="1GiB")
    assert (bug.label, bug.budget_bytes) == ("feature-cache", 1 << 30)
    (course_copy / "mine.py").write_text("import torch\n")
    mine = sides.prepare("mine.py --steps 3")
    assert (mine.label, mine.args, mine.budget_bytes, mine.exercise) == ("mine", ("--steps", "3"), None, None)


# --------------------------------------------------------------------------- the command


def wide_console(monkeypatch) -> None:
    """A wide terminal for the CLI's console, which read COLUMNS once, when it was made (by whichever test was first)."""
    from oomlab.cli import console

    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(console, "width", 250)


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OOMLAB_ROOT", raising=False)
    wide_console(monkeypatch)
    return tmp_path


def test_compare_two_pickles_writes_the_result_and_the_picture(scripts, here, capsys):
    bug, fix = scripts
    write_snapshot_pickle(bug_snapshot(bug), here / "bug.pickle", str(here))
    write_snapshot_pickle(fix_snapshot(fix), here / "fix.pickle", str(here))
    rc, out = oomlab(capsys, "compare", "bug.pickle", "fix.pickle", "--out", "cmp")
    assert rc == 0, out
    assert "B holds 2.0 MiB more live memory than A" in out and "train.py:9 → train.py:10" not in out  # unchanged: not listed
    assert "train.py:8" in out and "cache = torch.empty(4, 256, device=" in out and "only in B" in out
    result = json.loads((here / "cmp" / "compare.json").read_text())
    assert result["sides"]["a"]["label"] == "bug" and result["grown"][0]["site"] == "train.py:8"
    assert (here / "cmp" / "compare.png").is_file()


def test_the_same_file_twice_is_fine(scripts, here, capsys):
    bug, _ = scripts
    write_snapshot_pickle(bug_snapshot(bug), here / "bug.pickle", str(here))
    rc, out = oomlab(capsys, "compare", "bug.pickle", "bug.pickle")
    assert rc == 0 and "A and B hold the same live memory" in out, out
    [written] = (here / ".oomlab" / "runs").glob("*/compare.json")
    assert written.parent.name == "bug-vs-bug-compare"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "No snapshot at gone.pickle."),
        (lambda d: (d / "gone.pickle").write_text("notes"), "is not a readable pickle"),
        (lambda d: (d / "gone.pickle").write_bytes(pickle.dumps([1, 2], protocol=4)), "a segment is a int, not a dict"),
        (
            lambda d: (d / "gone.pickle").write_bytes(pickle.dumps({"tensors": 1}, protocol=4)),
            "is a pickle but not an allocator snapshot",
        ),
        (lambda d: (d / "gone.pickle").write_bytes(pickle.dumps(Path("x"), protocol=4)), "refers to the Python object"),
    ],
)
def test_a_bad_snapshot_file_is_one_clear_error(scripts, here, capsys, make, message):
    bug, _ = scripts
    write_snapshot_pickle(bug_snapshot(bug), here / "good.pickle", str(here))
    make(here)
    rc, out = oomlab(capsys, "compare", "good.pickle", "gone.pickle")
    assert rc == 2 and message in out, out
    assert not (here / ".oomlab").exists()  # nothing ran, nothing was written


def test_bad_results_and_folders_are_one_clear_error(here, capsys):
    (here / "hunt.json").write_text(json.dumps({"tool": "hunt", "kind": "none"}))
    (here / "broken.json").write_text("{not json")
    (here / "failed.json").write_text(json.dumps({"tool": "snapshot", "kind": "error", "error": "no CUDA"}))
    (here / "empty").mkdir()
    cases = {
        "hunt.json": "hunt.json is not a snapshot result: it is the hunt tool's result.",
        "broken.json": "broken.json is not valid JSON",
        "failed.json": "failed.json records a snapshot that failed: no CUDA.",
        "empty": "empty is a folder with no snapshot.json or snapshot.pickle in it.",
        "missing.json": "No snapshot at missing.json.",
        "nothing-here": "is neither a file here nor an exercise",
    }
    for arg, message in cases.items():
        rc, out = oomlab(capsys, "compare", arg, arg)
        assert rc == 2 and message in out, (arg, out)


def test_a_bad_option_is_refused_before_anything_runs(scripts, here, capsys):
    (here / "train.py").write_text("import torch\n")
    rc, out = oomlab(capsys, "compare", "train.py", "train.py", "--budget", "lots")
    assert rc == 2 and "not a memory size" in out, out
    write_snapshot_pickle(bug_snapshot(scripts[0]), here / "bug.pickle", str(here))
    rc, out = oomlab(capsys, "compare", "bug.pickle", "bug.pickle", "--time-limit", "-1")
    assert rc == 2 and "--time-limit: -1 is not a positive number of seconds." in out, out
    rc, out = oomlab(capsys, "compare", "train.py", "train.py", "--top", "0")
    assert rc == 2 and "--top" in out, out


def test_compare_runs_snapshot_and_hunt_on_the_bug_and_its_fix(course_copy, monkeypatch, capsys):
    """The exercise and its reference fix, with the measuring process faked: each run's snapshot as a real one names lines."""
    from oomlab.cli import tools as commands

    monkeypatch.chdir(course_copy)
    wide_console(monkeypatch)
    bug, fix = course_copy / "exercises/feature-cache/train.py", course_copy / "solutions/feature-cache/train.py"
    snapshots = {"feature-cache": bug_like(bug), "feature-cache-fix": fix_like(fix)}
    hunts = {
        "feature-cache": [holder("global 'features'", "list", direct=800 * MIB, tensors=40)],
        "feature-cache-fix": [holder("global 'features'", "Tensor", direct=800 * MIB, tensors=1, tensor_root=True)],
    }
    runs = []

    def fake_run_tool(target, name, out, options):
        runs.append((target.label, name, target.budget_bytes, out.name))
        out.mkdir(parents=True, exist_ok=True)
        if name == "snapshot":
            snapshot = snapshots[target.label]
            write_snapshot_pickle(snapshot, out / "snapshot.pickle", str(target.root), dict(target.shown_as))
            result = {**analyze(snapshot, script=str(target.script)), "snapshot_file": "snapshot.pickle"}
        else:
            result = summarize(hunts[target.label])
        status = "oom" if target.label == "feature-cache" else "ok"
        result.update(out_dir=str(out), run={"status": status, "where": "train.py:31" if status == "oom" else None})
        return Measurement(script=str(target.script), status=status), result

    monkeypatch.setattr(commands, "run_tool", fake_run_tool)
    rc, out = oomlab(capsys, "compare", "feature-cache", "solutions/feature-cache/train.py")
    assert rc == 0, out
    budget = 1_207_959_552
    assert sorted(runs) == [
        ("feature-cache", "hunt", budget, "a-hunt"),
        ("feature-cache", "snapshot", budget, "a-snapshot"),
        ("feature-cache-fix", "hunt", budget, "b-hunt"),
        ("feature-cache-fix", "snapshot", budget, "b-snapshot"),
    ]
    [path] = (course_copy / ".oomlab" / "runs").glob("feature-cache-vs-feature-cache-fix-compare/compare.json")
    result = json.loads(path.read_text())
    assert result["sides"]["a"]["ended"] == "OOM at train.py:31" and result["sides"]["b"]["ended"] == "finished"
    rows = {r["site"]: r for r in result["grown"] + result["shrunk"]}
    assert rows["train.py:31"]["matched_by"] == "only in A" and rows["train.py:31"]["code"] == "features.append(encoder(x))"
    assert rows["train.py:29"]["code"] == "features = torch.empty(n_chunks, chunk, d_feature, device=device)"
    assert rows["train.py:29"]["matched_by"] == "only in B"
    moved = "train.py:30 → train.py:33"
    assert rows[moved]["matched_by"] == "line text" and rows[moved]["growth"] == -30 * MIB
    assert [(h["holder"], h["growth"]) for h in result["holders"]] == [("tensor `features` (global)", 0)]
    assert "tensor `features` (global)" in out and moved in out


def bug_like(script: Path) -> dict:
    """feature-cache at its OOM: 40 features appended (line 31), two x's (line 30) live."""
    b = Builder()
    for _ in range(40):
        b.segment([block(20 * MIB, stack=stack(script, (31, "<module>"))), block(12 * MIB, "inactive")])
    b.segment([block(32 * MIB, stack=stack(script, (30, "<module>")))])
    return b.snapshot()


def fix_like(script: Path) -> dict:
    """Its fix at the end: the cache allocated whole (line 29), one small x left (line 33, was 30)."""
    b = Builder()
    b.segment([block(800 * MIB, stack=stack(script, (29, "<module>")))])
    b.segment([block(2 * MIB, stack=stack(script, (33, "<module>")))])
    return b.snapshot()


@pytest.mark.gpu
def test_compare_on_a_real_bug_and_its_fix(course_copy):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200"}
    env.pop("OOMLAB_ROOT", None)
    done = subprocess.run(
        [sys.executable, "-m", "oomlab", "compare", "feature-cache", "solutions/feature-cache/train.py", "--out", "cmp"],
        cwd=course_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((course_copy / "cmp" / "compare.json").read_text())
    figures = {f["figure"]: f for f in result["figures"]}
    assert result["sides"]["a"]["ended"].startswith("OOM") and result["sides"]["b"]["ended"] == "finished"
    assert figures["non_releasable"]["change"] < 0 and figures["segments"]["change"] < 0
    shrunk = {r["code"]: r for r in result["shrunk"]}
    assert shrunk["features.append(encoder(x))"]["matched_by"] == "only in A"
    assert result["holders"] is not None
    assert (course_copy / "cmp" / "compare.png").is_file()
