"""PyTorch's memory viewer on the committed snapshots (``oomlab dev viewer-shots``, :mod:`oomlab.site.viewer_shots`).

The pictures are checked against ``course/figures/viewer-shots.json`` and the snapshots they were
taken of, so a snapshot redrawn by ``oomlab dev figures`` asks for new pictures; the pages that
show them against the record; the command's refusals in a fresh process. The viewer itself and
d3 are not in the project, so the browser tests drive a stand-in viewer of a few lines (they need
Debian's Chromium and selenium, and are skipped without them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from oomlab.errors import OomLabError
from oomlab.site import viewer_shots as shots
from tests.forked_commands import oomlab_commands

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "course" / "figures"
RECORD = ROOT / shots.RECORD
CDN = "https://cdn.skypack.dev/"


def record() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- the committed pictures


def test_every_shot_is_recorded_as_the_module_asks_for_it():
    recorded = {(s["png"], s["snapshot"], s["view"], tuple(s.get("pointer") or ())) for s in record()["shots"]}
    wanted = {(s.png, s.pickle, s.view, tuple(s.pointer or ())) for s in shots.SHOTS}
    assert recorded == wanted, "SHOTS and viewer-shots.json differ: run `oomlab dev viewer-shots` (see the README)"


@pytest.mark.parametrize("shot", record()["shots"], ids=lambda s: s["png"])
def test_each_picture_is_of_the_committed_snapshot_and_is_the_png_recorded(shot):
    pickle = FIGURES / shot["snapshot"]
    assert pickle.is_file(), f"{shot['snapshot']} is gone: take the pictures again"
    assert sha256(pickle) == shot["snapshot_sha256"], (
        f"{shot['snapshot']} changed since {shot['png']} was taken of it: run `oomlab dev viewer-shots` and read the "
        "pictures against their captions in oomlab/site/viewer_shots.py"
    )
    png = FIGURES / shot["png"]
    data = png.read_bytes()
    assert shots.png_size(data) == (shot["width"], shot["height"]) == shots.WINDOW
    assert hashlib.sha256(data).hexdigest() == shot["png_sha256"], f"{shot['png']} is not the picture recorded"
    assert shot["view"] in shots.VIEWS
    assert re.fullmatch(r"[0-9a-f]{64}", shot["memory_viz_sha256"]) and shot["d3"].startswith("5.") and shot["chromium"]
    assert shot["shapes"] > 0, "the viewer drew nothing"


def test_png_size_reads_the_header_and_refuses_what_is_not_a_png():
    head = b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR" + (1400).to_bytes(4, "big") + (900).to_bytes(4, "big")
    assert shots.png_size(head) == (1400, 900)
    with pytest.raises(ValueError):
        shots.png_size(b"GIF89a" + head[6:])


# --------------------------------------------------------------------------- the pages


def test_an_exercise_page_shows_a_recorded_shot_with_its_caption_and_what_the_viewer_printed():
    from oomlab.site.exercise_page import viewer_shot

    shot = shots.SHOTS[0]
    entry = next(s for s in record()["shots"] if s["png"] == shot.png)
    md = "\n".join(viewer_shot("exercises/x.md", entry))
    assert f"](../figures/{shot.png})" in md and shot.caption in md
    assert f"`{entry['pointed_at']}`" in md and "https://pytorch.org/memory_viz" in md
    assert viewer_shot("exercises/x.md", None) == []
    assert viewer_shot("exercises/x.md", {**entry, "png": "other-memory-viz.png"}) == [], "no caption: no picture"


def test_a_hand_written_page_says_what_takes_a_viewer_shot_not_yet_taken():
    from oomlab.site.markers import figure_image
    from oomlab.site.reports import Reports

    taken = Reports(exercises=[], viewer_shots=record())
    name = shots.SHOTS[2].png
    assert "figures/" + name in figure_image("allocator.md", name, "alt", taken)
    assert "`oomlab dev viewer-shots` takes it" in figure_image("allocator.md", name, "alt", Reports(exercises=[]))


def test_the_built_pages_show_the_pictures_they_name(built_site):
    """Each recorded picture is on its exercise's page and in the built site, and allocator.md shows its own."""
    for shot in record()["shots"]:
        exercise = shot["snapshot"].removesuffix("-snapshot.pickle").rsplit("-", 1)[0]
        page = (built_site / "exercises" / f"{exercise}.html").read_text(encoding="utf-8")
        assert f'src="../figures/{shot["png"]}"' in page, f"{shot['png']} is not on {exercise}'s page"
        assert (built_site / "figures" / shot["png"]).is_file()
    allocator = (built_site / "allocator.html").read_text(encoding="utf-8")
    for name in re.findall(r"oomlab:figure (\S+-memory-viz\.png)", (ROOT / "course" / "allocator.md").read_text()):
        assert f'src="figures/{name}"' in allocator and (FIGURES / name).is_file(), name


# --------------------------------------------------------------------------- the inputs and the import map


def fake_inputs(tmp_path: Path, viewer: str, d3_version: str = "5.16.0") -> tuple[Path, Path]:
    """A stand-in MemoryViz.js (``viewer`` is its body) and a node_modules folder with a d3 and a d3-scale."""
    modules = tmp_path / "node_modules"
    for name, files in {
        "d3": {"index.js": 'export * from "d3-scale";\nexport const select = () => null;\n'},
        "d3-scale": {
            "src/index.js": 'export {scaleLinear} from "./linear";\n',
            "src/linear.js": "export const scaleLinear = 1;\n",
        },
    }.items():
        (modules / name).mkdir(parents=True)
        module = "index.js" if name == "d3" else "src/index.js"
        (modules / name / "package.json").write_text(json.dumps({"name": name, "version": d3_version, "module": module}))
        for rel, text in files.items():
            (modules / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (modules / name / rel).write_text(text)
    viz = tmp_path / "MemoryViz.js"
    viz.write_text(
        f'import * as d3 from "{CDN}d3@5";\nimport {{scaleLinear}} from "{CDN}d3-scale@1";\n'
        "const kinds = {'Active Memory Timeline': null};\n" + viewer
    )
    return viz, modules


def test_the_import_map_sends_the_cdn_urls_bare_names_and_extensionless_imports_to_local_files(tmp_path):
    viz, modules = fake_inputs(tmp_path, "export function add_local_files(files, view) {}\n")
    inputs = shots.check_inputs(viz, modules)
    assert inputs.cdn_imports == {f"{CDN}d3@5": "d3", f"{CDN}d3-scale@1": "d3-scale"}
    assert inputs.views == ("Active Memory Timeline",) and inputs.d3_version == "5.16.0"
    imports = shots.import_map(inputs)["imports"]
    assert imports[f"{CDN}d3@5"] == imports["d3"] == "/node_modules/d3/index.js"
    assert imports[f"{CDN}d3-scale@1"] == imports["d3-scale"] == "/node_modules/d3-scale/src/index.js"
    assert imports["/node_modules/d3-scale/src/linear"] == "/node_modules/d3-scale/src/linear.js"
    # the d3 package itself given for its node_modules: the folder above is meant
    assert shots.check_inputs(viz, modules / "d3").node_modules == modules.resolve()


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("no MemoryViz.js", "no such file"),
        ("not the viewer", "is not PyTorch's MemoryViz.js"),
        ("no folder", "no such folder"),
        ("no d3", "has no d3 package"),
        ("d3 7", "has d3 7.9.0; MemoryViz.js is written for d3 5"),
    ],
)
def test_inputs_that_are_not_the_viewer_and_d3_5_are_refused_with_what_to_get(tmp_path, case, said):
    viz, modules = fake_inputs(
        tmp_path, "export function add_local_files(files, view) {}\n", "7.9.0" if case == "d3 7" else "5.16.0"
    )
    if case == "no MemoryViz.js":
        viz = tmp_path / "missing.js"
    elif case == "not the viewer":
        viz.write_text("export const x = 1;\n")
    elif case == "no folder":
        modules = tmp_path / "missing"
    elif case == "no d3":
        modules = tmp_path
    with pytest.raises(OomLabError, match=re.escape(said)) as err:
        shots.check_inputs(viz, modules)
    assert err.value.todo, "the message says where to get the input"


def oomlab(*args: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "OOMLAB_ROOT": str(ROOT)}
    proc = oomlab_commands.run(list(args), ROOT, env, 60, program="oomlab")  # a process of its own, forked
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("missing", ["--memory-viz", "--d3"])
def test_the_command_refuses_a_missing_input_with_exit_2_and_one_message(tmp_path, missing):
    viz, modules = fake_inputs(tmp_path, "export function add_local_files(files, view) {}\n")
    given = {"--memory-viz": str(viz), "--d3": str(modules), missing: str(tmp_path / "nowhere")}
    before = {p: p.stat().st_mtime_ns for p in FIGURES.glob(f"*{shots.PNG_SUFFIX}")}
    rc, out = oomlab("dev", "viewer-shots", *[x for pair in given.items() for x in pair])
    assert rc == 2, out
    assert "Traceback" not in out and out.count("nowhere") == 1, out
    assert ("no such file" if missing == "--memory-viz" else "no such folder") in out
    assert ("PyTorch's repository" if missing == "--memory-viz" else "npm install d3@5") in out
    assert before == {p: p.stat().st_mtime_ns for p in FIGURES.glob(f"*{shots.PNG_SUFFIX}")}, "a picture was rewritten"


# --------------------------------------------------------------------------- in Chromium, with a stand-in viewer

needs_browser = pytest.mark.skipif(
    not (shots.CHROMIUM.is_file() and shots.CHROMEDRIVER.is_file()) or __import__("importlib").util.find_spec("selenium") is None,
    reason="needs Debian's chromium and chromium-driver and selenium (the dev extra)",
)
DRAWS = """
export function add_local_files(files, view) {
  const ns = "http://www.w3.org/2000/svg";
  const div = document.createElement("div");
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("style", "width: 100%; height: 300px");
  const g = svg.appendChild(document.createElementNS(ns, "g"));
  const rect = g.appendChild(document.createElementNS(ns, "rect"));
  rect.setAttribute("width", "200"); rect.setAttribute("height", String(atob(files[0].base64).length % 97 + 10));
  rect.addEventListener("mouseover", () => { pre.textContent = `${files[0].name} in ${view} (${d3.select()} ${scaleLinear})`; });
  const pre = document.createElement("pre");
  pre.textContent = "none";
  div.append(svg, pre);
  document.body.append(div);
}
"""


def one_shot(tmp_path: Path, pointer=None) -> tuple[tuple[shots.Shot, ...], Path]:
    figures = tmp_path / "figures"
    figures.mkdir()
    name = shots.SHOTS[0].name
    (figures / f"{name}-snapshot.pickle").write_bytes((FIGURES / f"{name}-snapshot.pickle").read_bytes())
    return (shots.Shot(name, "Active Memory Timeline", "caption", pointer),), figures


@needs_browser
def test_a_viewer_that_draws_is_photographed_at_the_window_size_offline(tmp_path):
    viz, modules = fake_inputs(tmp_path, DRAWS)
    chosen, figures = one_shot(tmp_path, pointer=(0.1, 0.1))
    written, path = shots.take(shots.check_inputs(viz, modules), figures, chosen, timeout_s=20)
    entry = json.loads(path.read_text())["shots"][0]
    assert shots.png_size(written[0].read_bytes()) == shots.WINDOW == (entry["width"], entry["height"])
    assert entry["pointed_at"] == f"{chosen[0].pickle} in Active Memory Timeline (null 1)", "the pointer and imports worked"
    assert entry["snapshot_sha256"] == sha256(figures / chosen[0].pickle) and entry["d3"] == "5.16.0"


@needs_browser
@pytest.mark.parametrize(
    ("viewer", "said"),
    [
        ("export function add_local_files(files, view) {}\n", "drew nothing"),
        (DRAWS + 'fetch("https://example.com/data.json").catch(() => {});\n', "https://example.com/data.json"),
        ("export function add_local_files(files, view) { throw new Error('no such view'); }\n", "no such view"),
    ],
    ids=["never draws", "asks the internet", "throws"],
)
def test_a_viewer_that_fails_is_named_in_one_message_and_nothing_is_written(tmp_path, viewer, said):
    viz, modules = fake_inputs(tmp_path, viewer)
    chosen, figures = one_shot(tmp_path)
    with pytest.raises(OomLabError, match=re.escape(said)):
        shots.take(shots.check_inputs(viz, modules), figures, chosen, timeout_s=3)
    assert sorted(p.name for p in figures.iterdir()) == [chosen[0].pickle]
