"""Screenshots of PyTorch's own memory viewer on the course's committed snapshots (``oomlab dev viewer-shots``).

The exercise pages tell the learner to drop a snapshot on https://pytorch.org/memory_viz. The
pictures this module takes show what they will see there: the viewer, unmodified, drawing one of
the snapshots under ``course/figures/`` (``NAME-snapshot.pickle``), in the views that show the
exercise's story best (:data:`SHOTS`).

The viewer is one JavaScript file, ``torch/utils/viz/MemoryViz.js`` in PyTorch's source
repository. The torch wheel does not carry it, and the course may not copy it, nor the d3 library
it imports (from a CDN, by URL): so a maintainer passes both in, as paths, and only the pictures
and a record of what drew them are committed. The two inputs:

- ``--memory-viz``: MemoryViz.js, from PyTorch's repository at the torch version the snapshots
  were taken with;
- ``--d3``: a ``node_modules`` folder from ``npm install d3@5`` (d3 and every ``d3-*`` package; the
  viewer is written against d3 5, whose ``d3.event`` later versions removed).

How the picture is taken, offline:

1. A temporary folder gets MemoryViz.js as it is, the d3 packages, the snapshot (base64, as the
   viewer's ``add_local_files`` takes it) and a small page. The page's import map sends each CDN
   URL that MemoryViz.js imports, and each bare ``d3-*`` name that d3's ES modules import, to the
   package's ES-module entry in the folder; it also sends each extensionless relative import
   (``./constant``, as d3 5's sources write them for bundlers) to its ``.js`` file, so that every
   module is loaded once, from one URL.
2. The folder is served on 127.0.0.1 (``http.server`` in a thread, on a free port) and opened in
   headless Chromium (selenium), with a fresh profile, its calls home turned off and every host
   but 127.0.0.1 unresolvable. A request for anything else, a SEVERE console message or a
   script error fails the shot, and the message names it.
3. Once the viewer has drawn (the shapes in its ``svg`` stop changing) and, where the shot names a
   point, the mouse rests there and the viewer has printed what lies under it, Chromium's viewport
   of :data:`WINDOW` pixels is written to ``course/figures/NAME-memory-viz.png``. Nothing is
   written until every shot is taken.

``course/figures/viewer-shots.json`` records, per picture: the snapshot's file name and sha256,
the view, the pointer and what the viewer printed there, the picture's size and sha256, and what
drew it (MemoryViz.js's sha256, d3's version, Chromium's version). ``tests/test_viewer_shots.py`` checks the pictures against it and the
snapshots, so a snapshot redrawn by ``oomlab dev figures`` asks for new pictures.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

from oomlab.course import reports
from oomlab.errors import OomLabError
from oomlab.site.chromium import CHROMEDRIVER, CHROMIUM, serve, start

__all__ = [
    "CHROMEDRIVER",
    "CHROMIUM",
    "PNG_SUFFIX",
    "Inputs",
    "RECORD",
    "SHOTS",
    "VIEWS",
    "WINDOW",
    "Shot",
    "check_inputs",
    "import_map",
    "png_size",
    "shoot",
    "take",
]

WINDOW = (1400, 900)  # the viewport, in CSS pixels at a device scale of 1: the picture's size
DRAW_TIMEOUT_S = 60.0  # how long the viewer may take to draw the largest snapshot
RECORD = reports.VIEWER_SHOTS
COMMAND = "oomlab dev viewer-shots --memory-viz FILE --d3 FOLDER"
PNG_SUFFIX = "-memory-viz.png"  # NAME-memory-viz.png, beside NAME-snapshot.pickle

# The views MemoryViz.js offers, by the names its menu shows.
VIEWS = ("Active Memory Timeline", "Allocator State History", "Active Cached Segment Timeline")


@dataclass(frozen=True)
class Shot:
    """One picture: a committed snapshot (``NAME-snapshot.pickle``) in one view of the viewer.

    ``pointer``, where given, is where the mouse rests, as fractions of the view's drawing (its
    first ``svg``) from its top left: the viewer then outlines what lies there and prints what it
    is (an allocation's size and stack, a segment's size and free space) under the drawing. The
    record keeps that text's first line and the first line naming a course file, as the viewer
    printed them, so that the page can quote them and a new snapshot cannot leave a stale quote.
    ``caption`` is what the page says the picture shows: written from the picture, it stays true
    while the record's snapshot hash matches (``tests/test_viewer_shots.py``).
    """

    name: str  # ``feature-cache-bug``: the snapshot is course/figures/NAME-snapshot.pickle
    view: str  # one of VIEWS
    caption: str
    pointer: tuple[float, float] | None = None

    @property
    def pickle(self) -> str:
        return f"{self.name}-snapshot.pickle"

    @property
    def png(self) -> str:
        return self.name + PNG_SUFFIX


# The timeline tells feature-cache's story (every step leaves tensors behind; the fix fills one block made
# up front), the allocator's state at the last event tells ragged-batches' (segments cut for earlier batch
# lengths, each pinned by a small block, where the fix leaves whole segments free).
SHOTS = (
    Shot(
        "feature-cache-bug",
        "Active Memory Timeline",
        "Each band is one live tensor, from its allocation to its free, stacked by size (the left axis, in bytes): "
        "the total climbs with every step, and each step leaves bands that run on to the end of the trace. The "
        "pointer rests on one of them, which the viewer outlines.",
        (0.9, 0.5),
    ),
    Shot(
        "feature-cache-fix",
        "Active Memory Timeline",
        "The reference fix in the same view: one large block, the wide grey band the pointer rests on, is there "
        "from the start of the trace, and the total stays nearly flat to the end instead of climbing.",
        (0.9, 0.5),
    ),
    Shot(
        "ragged-batches-bug",
        "Allocator State History",
        "On the left is the trace, event by event, down to the OOM (highlighted) and the 127.3 MiB it asked for; "
        "on the right is the allocator's state at that event, one row per segment, its live blocks in colour and "
        "its free space white. Four rows are white but for one small block at their end; the pointer rests on "
        "one, which the viewer outlines in red.",
        (0.47, 0.336),
    ),
    Shot(
        "ragged-batches-fix",
        "Allocator State History",
        "The reference fix at its last event, in the same view: most of the longest rows, the largest segments, "
        "are white from end to end, segments with no live block in them. The pointer rests on one, which the "
        "viewer outlines in red.",
        (0.485, 0.405),
    ),
)

# Chromium without its calls home; --host-resolver-rules makes sure nothing leaves the machine even if a
# page asks, and the attempt still shows in the performance log.
CHROMIUM_FLAGS = ("--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}")  # beside chromium.OFFLINE_FLAGS

# The page: the import map, a place for errors, and the viewer fed one snapshot. {…} are filled by page().
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>{title}</title>
<script type="importmap">
{importmap}
</script>
<script>
window.oomlabShot = {{errors: []}};
addEventListener("error", e => oomlabShot.errors.push(String(e.message || e)));
addEventListener("unhandledrejection", e => oomlabShot.errors.push(String(e.reason)));
</script>
<script type="module">
import("./MemoryViz.js")
  .then(async viewer => {{
    const answer = await fetch("./snapshot.b64");
    const text = await answer.text();
    viewer.add_local_files([{{name: {name}, base64: text.trim()}}], {view});
  }})
  .catch(err => oomlabShot.errors.push(String(err && err.stack || err)));
</script>
</head>
<body></body>
</html>
"""

# What the viewer has drawn so far: the shapes in the svg of the view on show, and the errors.
DRAWN_JS = """
const shown = [...document.querySelectorAll("body > div")].filter(d => d.style.display !== "none" && d.querySelector("svg"));
const shapes = shown.length ? shown[0].querySelectorAll("svg polygon, svg g rect").length : 0;
return {shapes: shapes, errors: window.oomlabShot ? window.oomlabShot.errors : ["the page did not start"]};
"""
# The text the viewer prints for what the pointer rests on: the pre that is its parent's only pre (the
# trace's event list is a column of pres).
POINTED_JS = """
const shown = [...document.querySelectorAll("body > div")].filter(d => d.style.display !== "none" && d.querySelector("svg"))[0];
const texts = [...shown.querySelectorAll("pre")].filter(p => p.parentElement.querySelectorAll(":scope > pre").length === 1);
return texts.map(p => p.textContent);
"""
VIEW_SVG_JS = """
const shown = [...document.querySelectorAll("body > div")].filter(d => d.style.display !== "none" && d.querySelector("svg"))[0];
return shown.querySelector("svg");
"""
SETTLE_POLLS = 3  # the viewer is done when this many polls in a row count the same shapes
POLL_S = 0.25


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Inputs:
    """The two things the course does not ship, checked: the viewer and the d3 packages."""

    memory_viz: Path
    node_modules: Path
    d3_version: str
    cdn_imports: dict[str, str]  # each URL MemoryViz.js imports → the d3 package it names
    views: tuple[str, ...]  # those of VIEWS that this MemoryViz.js offers

    @property
    def memory_viz_sha256(self) -> str:
        return sha256(self.memory_viz)


CDN_IMPORT = re.compile(r"""^\s*import\s[^;]*?\sfrom\s+["'](?P<url>https?://[^"']+)["']""", re.M)


def check_inputs(memory_viz: Path, d3: Path) -> Inputs:
    """MemoryViz.js and a node_modules folder with d3 5, or an OomLabError saying what is wrong and where to get it."""
    get_viz = "Get torch/utils/viz/MemoryViz.js from PyTorch's repository, at the torch version of the snapshots."
    get_d3 = "Run `npm install d3@5` in an empty folder and pass its node_modules folder."
    if not memory_viz.is_file():
        raise OomLabError(f"--memory-viz {memory_viz}: no such file.", get_viz)
    text = memory_viz.read_text(encoding="utf-8", errors="replace")
    if "export function add_local_files" not in text:
        raise OomLabError(f"--memory-viz {memory_viz} is not PyTorch's MemoryViz.js (it exports no add_local_files).", get_viz)
    if d3.name == "d3" and (d3 / "package.json").is_file():
        d3 = d3.parent  # the d3 package itself was given: its node_modules is the folder above
    package = d3 / "d3" / "package.json"
    if not d3.is_dir():
        raise OomLabError(f"--d3 {d3}: no such folder.", get_d3)
    if not package.is_file():
        raise OomLabError(f"--d3 {d3} has no d3 package (no d3/package.json in it).", get_d3)
    version = read_package(package).get("version", "")
    if not version.startswith("5."):
        raise OomLabError(f"--d3 {d3} has d3 {version or 'of no version'}; MemoryViz.js is written for d3 5.", get_d3)
    cdn = {}
    for url in CDN_IMPORT.findall(text):
        name = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1].split("@")[0]
        if not (d3 / name / "package.json").is_file():
            raise OomLabError(f"MemoryViz.js imports {url}, and --d3 {d3} has no {name} package for it.", get_d3)
        cdn[url] = name
    if not cdn:
        raise OomLabError(f"--memory-viz {memory_viz} imports nothing from a CDN: not the MemoryViz.js this expects.", get_viz)
    views = tuple(v for v in VIEWS if f"'{v}'" in text or f'"{v}"' in text)
    return Inputs(memory_viz.resolve(), d3.resolve(), version, cdn, views)


def read_package(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise OomLabError(f"{path} cannot be read as a package.json: {err}.") from None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- the page


def d3_packages(node_modules: Path) -> list[Path]:
    return sorted(p for p in node_modules.iterdir() if p.name == "d3" or p.name.startswith("d3-"))


def import_map(inputs: Inputs, prefix: str = "/node_modules") -> dict:
    """The page's import map: CDN URLs and bare ``d3-*`` names to ES-module entries, extensionless imports to files."""
    entries = {}
    imports: dict[str, str] = {}
    for package in d3_packages(inputs.node_modules):
        module = read_package(package / "package.json").get("module")
        if not module:
            raise OomLabError(
                f'{package.name} in {inputs.node_modules} has no ES-module entry (no "module" in its package.json).'
            )
        entries[package.name] = f"{prefix}/{package.name}/{module.removeprefix('./')}"
        imports[package.name] = entries[package.name]
        # d3 5's sources import "./constant" for their bundler; a browser needs the file's own name.
        for js in sorted(package.rglob("*.js")):
            if "node_modules" in js.relative_to(package).parts:
                continue
            url = f"{prefix}/{js.relative_to(inputs.node_modules).as_posix()}"
            imports[url.removesuffix(".js")] = url
    for url, name in inputs.cdn_imports.items():
        imports[url] = entries[name]
    return {"imports": imports}


def page(inputs: Inputs, shot: Shot) -> str:
    return PAGE.format(
        title=f"{shot.pickle}: {shot.view}",
        importmap=json.dumps(import_map(inputs), indent=1),
        name=json.dumps(shot.pickle),
        view=json.dumps(shot.view),
    )


def lay_out(folder: Path, inputs: Inputs, shot: Shot, snapshot: Path) -> None:
    """Write the page, the viewer, the d3 packages and the snapshot into ``folder``, to be served."""
    (folder / "index.html").write_text(page(inputs, shot), encoding="utf-8")
    shutil.copyfile(inputs.memory_viz, folder / "MemoryViz.js")
    (folder / "snapshot.b64").write_bytes(base64.b64encode(snapshot.read_bytes()))
    for package in d3_packages(inputs.node_modules):
        target = folder / "node_modules" / package.name
        if not target.exists():
            shutil.copytree(package, target, ignore=shutil.ignore_patterns("node_modules", "*.md"))


# --------------------------------------------------------------------------- the browser


@contextmanager
def chromium(profile: Path):
    """Headless Chromium with a fresh profile in ``profile``, its viewport :data:`WINDOW` at a scale of 1."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.is_file():
            raise OomLabError(
                f"{binary} is missing: the pictures are taken in Debian's Chromium.", "apt-get install chromium chromium-driver"
            )
    try:
        from selenium.common.exceptions import WebDriverException
    except ImportError:
        raise OomLabError("selenium is not installed: the pictures are taken through it.", "pip install -e '.[dev]'") from None
    try:
        driver = start(profile, *CHROMIUM_FLAGS)
    except WebDriverException as err:
        raise OomLabError(f"Chromium did not start: {err.msg or err}".strip()) from None
    try:
        width, height = WINDOW
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        )
        driver.set_page_load_timeout(DRAW_TIMEOUT_S)
        driver.get("about:blank")  # Chromium's own first page is none of ours: drop its logs
        drain(driver)
        yield driver
    finally:
        driver.quit()


def drain(driver) -> tuple[list[str], list[str]]:
    """Everything logged since the last call: the URLs requested, and the SEVERE console messages."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return urls, severe


def off_machine(urls: list[str], base: str) -> list[str]:
    return [u for u in urls if urlsplit(u).scheme not in ("data", "blob", "about") and not u.startswith(base + "/")]


def wait_drawn(driver, shot: Shot, timeout_s: float) -> int:
    """Poll until the viewer's svg holds shapes and their count stops changing; the count, or an OomLabError."""
    deadline = time.monotonic() + timeout_s
    counts: list[int] = []
    while time.monotonic() < deadline:
        state = driver.execute_script(DRAWN_JS)
        if state["errors"]:
            raise OomLabError(f"The viewer failed on {shot.pickle} ({shot.view}): {'; '.join(state['errors'])}")
        counts.append(state["shapes"])
        if counts[-1] > 0 and len(counts) >= SETTLE_POLLS and len(set(counts[-SETTLE_POLLS:])) == 1:
            return counts[-1]
        time.sleep(POLL_S)
    raise OomLabError(
        f"The viewer drew nothing of {shot.pickle} ({shot.view}) in {timeout_s:g} s"
        + (f" (it had drawn {counts[-1]} shapes)." if counts and counts[-1] else "."),
        "Pass a longer --timeout, or open the page in a browser to see what it does.",
    )


def png_size(data: bytes) -> tuple[int, int]:
    """A PNG's width and height, from its header; a ValueError for anything that is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def point(driver, shot: Shot, timeout_s: float) -> dict:
    """Rest the mouse on ``shot.pointer`` and wait for the viewer to print what lies there; the lines it printed."""
    from selenium.webdriver.common.action_chains import ActionChains

    before = driver.execute_script(POINTED_JS)
    svg = driver.execute_script(VIEW_SVG_JS)
    box = svg.rect
    fx, fy = shot.pointer
    # Selenium 4 measures the offset from the element's centre.
    ActionChains(driver).move_to_element_with_offset(
        svg, round((fx - 0.5) * box["width"]), round((fy - 0.5) * box["height"])
    ).perform()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        texts = [t for t in driver.execute_script(POINTED_JS) if t.strip()]
        if texts and texts != before:
            lines = texts[0].strip().splitlines()
            course_line = next((line for line in lines if "train.py" in line), None)
            return {"pointer": list(shot.pointer), "pointed_at": lines[0], "course_frame": course_line}
        time.sleep(POLL_S)
    raise OomLabError(f"The viewer printed nothing for the pointer at {shot.pointer} on {shot.pickle} ({shot.view}).")


def browser_log(driver, base: str) -> str:
    """What went wrong in the browser since the last call, in words: requests that left 127.0.0.1, SEVERE messages."""
    urls, severe = drain(driver)
    said = []
    outside = sorted(set(off_machine(urls, base)))
    if outside:
        said.append(f"it asked for {', '.join(outside)}, and this machine is offline: every file must be local")
    if severe:
        said.append("the browser logged " + "; ".join(severe))
    return "; ".join(said)


def shoot(driver, inputs: Inputs, shot: Shot, snapshot: Path, work: Path, timeout_s: float) -> tuple[dict, bytes]:
    """Draw one snapshot in the viewer; the picture's record and the picture."""
    folder = work / shot.name
    folder.mkdir(parents=True)
    lay_out(folder, inputs, shot, snapshot)
    with serve(folder) as base:
        driver.get(f"{base}/index.html")
        try:
            shapes = wait_drawn(driver, shot, timeout_s)
            pointed = point(driver, shot, timeout_s) if shot.pointer else {}
        except OomLabError as err:
            log = browser_log(driver, base)
            raise OomLabError(err.what + (f" Meanwhile {log}." if log else ""), err.todo) from None
        log = browser_log(driver, base)
        if log:
            raise OomLabError(
                f"Drawing {shot.pickle} ({shot.view}): {log}.", "Check the import map's entries against MemoryViz.js's imports."
            )
        driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[0]))")
        data = driver.get_screenshot_as_png()
    size = png_size(data)
    if size != WINDOW:
        raise OomLabError(f"Chromium's picture is {size[0]}x{size[1]}, not the {WINDOW[0]}x{WINDOW[1]} asked for.")
    return {
        "png": shot.png,
        "snapshot": shot.pickle,
        "snapshot_sha256": sha256(snapshot),
        "view": shot.view,
        **pointed,
        "width": size[0],
        "height": size[1],
        "png_sha256": hashlib.sha256(data).hexdigest(),
        "shapes": shapes,
        "memory_viz_sha256": inputs.memory_viz_sha256,
        "d3": inputs.d3_version,
        "chromium": driver.capabilities.get("browserVersion", "?"),
    }, data


def take(
    inputs: Inputs,
    figures: Path,
    shots: tuple[Shot, ...] = SHOTS,
    timeout_s: float = DRAW_TIMEOUT_S,
    note: Callable[[str], None] = lambda s: None,
) -> tuple[list[Path], Path]:
    """Every shot's picture into ``figures`` (where the snapshots are) and the record beside them; the paths written."""
    missing = [s.pickle for s in shots if not (figures / s.pickle).is_file()]
    if missing:
        raise OomLabError(f"No snapshot {', '.join(missing)} in {figures}.", "On a CUDA GPU, `oomlab dev figures` writes them.")
    unknown = sorted({s.view for s in shots} - set(inputs.views))
    if unknown:
        raise OomLabError(
            f"{inputs.memory_viz} offers no view {', '.join(unknown)}; its views: {', '.join(inputs.views) or 'none known'}.",
            "Take MemoryViz.js from the PyTorch version the snapshots were taken with.",
        )
    taken = []
    with tempfile.TemporaryDirectory(prefix="oomlab-viewer-") as tmp:
        work = Path(tmp)
        with chromium(work / "profile") as driver:
            from selenium.common.exceptions import WebDriverException  # chromium() said where selenium is missing

            for shot in shots:
                note(f"{shot.pickle}: {shot.view}")
                try:
                    taken.append(shoot(driver, inputs, shot, figures / shot.pickle, work / "pages", timeout_s))
                except WebDriverException as err:  # Chromium crashed or timed out: the machine's, not a bug here
                    raise OomLabError(f"Chromium failed drawing {shot.pickle}: {(err.msg or str(err)).strip()}") from None
    # Written once every shot is taken: a sitting cut short leaves the pictures and their record as they were.
    for record, data in taken:
        (figures / record["png"]).write_bytes(data)
    path = figures / RECORD.name
    index = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": COMMAND,
        "shots": [record for record, _ in taken],
    }
    path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [figures / record["png"] for record, _ in taken], path
