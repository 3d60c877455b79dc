"""The course site: builds strictly and offline, with a page per exercise generated from its manifest.

Runs on CPU in a few seconds; needs the docs extra (mkdocs, mkdocs-material) and is
skipped without it.
"""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path

import pytest

from oomlab.course import Course

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]
VERIFY = ROOT / "course" / "measurements" / "verify.json"
EXTERNAL = ("fonts.googleapis.com", "unpkg.com")


def text_of(page: Path) -> str:
    """A built page's visible text, tags dropped, entities decoded, whitespace collapsed."""
    raw = page.read_text(encoding="utf-8")
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S)
    return normalize(html.unescape(re.sub(r"<[^>]+>", "", raw)))


def normalize(text: str) -> str:
    return " ".join(text.split())


def first_words(text: str, n: int = 6) -> str:
    """The first words of manifest text as a page shows it (backticks become code formatting)."""
    return " ".join(text.replace("`", "").split()[:n])


@pytest.fixture(scope="module")
def site(built_site) -> Path:
    """The site as `mkdocs build --strict` builds it, once per test session (tests/conftest.py)."""
    return built_site


@pytest.fixture(scope="module")
def course() -> Course:
    return Course(ROOT, working_tree=True)


def exercise_page(site: Path, ex_id: str) -> Path:
    return site / "exercises" / f"{ex_id}.html"


def test_every_exercise_has_a_page(site, course):
    assert course.exercises, "the course has no exercises"
    missing = [ex.id for ex in course.exercises if not exercise_page(site, ex.id).is_file()]
    assert not missing, f"no built page for: {', '.join(missing)}"


def test_exercise_pages_are_in_the_navigation(site, course):
    home = (site / "index.html").read_text(encoding="utf-8")
    for ex in course.exercises:
        assert f'href="exercises/{ex.id}.html"' in home, f"{ex.id} is not in the navigation"


@pytest.mark.parametrize("ex_id", [ex.id for ex in Course(ROOT, working_tree=True).exercises])
def test_exercise_page_comes_from_its_manifest(site, course, ex_id):
    ex = course.get(ex_id)
    text = text_of(exercise_page(site, ex.id))

    assert normalize(ex.title) in text
    for i, hint in enumerate(ex.hints, 1):
        assert first_words(hint) in text, f"hint {i} of {ex.id} is not on its page"

    source = ex.learner_path.read_text(encoding="utf-8")
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring, f"{ex.learner_path} has no module docstring"
    assert normalize(docstring.splitlines()[0]) in text, "the buggy script is not shown"

    for fix in ex.wrong_fixes:
        assert fix.name in text and first_words(fix.why) in text, f"wrong fix {fix.name} of {ex.id} is not explained"

    for alt in ex.alternatives:
        assert alt.name in text and first_words(alt.why) in text, f"alternative {alt.name} of {ex.id} is not shown"
    assert first_words(ex.interview.question, 8) in text, f"the interview question of {ex.id} is not on its page"
    assert first_words(ex.interview.answer, 8) in text, f"the model answer of {ex.id} is not on its page"

    for cmd in ("run", "check", "hint"):
        assert f"oomlab {cmd} {ex.id}" in text


FOLD = re.compile(
    r'<details class="(?P<kind>\w+)"(?P<open> open)?>\s*<summary>(?P<title>.*?)</summary>(?P<body>.*?)</details>', re.S
)


@pytest.mark.parametrize("ex_id", [ex.id for ex in Course(ROOT, working_tree=True).exercises])
def test_exercise_page_shows_the_reference_fix_only_in_its_closed_fold(site, course, ex_id):
    from oomlab.site.compare_fold import COMPARE_FOLD
    from oomlab.site.exercise_page import ESTIMATE_FOLD, FIX_FOLD

    ex = course.get(ex_id)
    if not ex.solution_path.is_file():
        pytest.skip(f"{ex.id} has no reference solution")
    raw = exercise_page(site, ex.id).read_text(encoding="utf-8")
    title = ESTIMATE_FOLD if ex.is_estimate else FIX_FOLD  # an estimator, shown as a change of the shipped one
    folds = [m for m in FOLD.finditer(raw) if html.unescape(m["title"]).strip() == title]
    assert len(folds) == 1 and not folds[0]["open"], f"the page of {ex.id} has no closed fold '{title}'"
    inside = normalize(html.unescape(re.sub(r"<[^>]+>", "", folds[0]["body"])))
    # What the fix changed, measured, quotes the fix's lines too: in a closed fold of its own, after the fix.
    compared = [m for m in FOLD.finditer(raw) if html.unescape(m["title"]).strip() == COMPARE_FOLD]
    assert all(not m["open"] and m.start() > folds[0].start() for m in compared), f"{ex.id}: the comparison is not closed"
    hidden = sorted([folds[0], *compared], key=lambda m: m.start())
    kept, last = [], 0
    for m in hidden:
        kept.append(raw[last : m.start()])
        last = m.end()
    outside = normalize(html.unescape(re.sub(r"<[^>]+>", "", "".join(kept) + raw[last:])))
    buggy = {normalize(line) for line in ex.learner_path.read_text(encoding="utf-8").splitlines()}
    fixed = {normalize(line) for line in ex.solution_path.read_text(encoding="utf-8").splitlines()}
    shipped = " | ".join(buggy)  # a line of the fix that is part of a shipped one, wrapped otherwise, gives nothing away
    added = [line for line in fixed - buggy if len(line) >= 16 and line not in shipped]
    missing = [line for line in added if line not in inside]
    assert not missing, f"the fold of {ex.id} does not show these lines of the reference fix: {missing}"
    # Wrong fixes and accepted alternatives are shown on purpose, folded under their own headings; a line
    # they share with the reference fix (a wrong fix that makes two of three fixes) is theirs to show.
    folded = (*ex.wrong_fixes, *ex.alternatives)
    shown = " | ".join(normalize(line) for fix in folded for edit in fix.edits for line in edit.replace.splitlines())
    spoilers = [line for line in added if line in outside and line not in shown]
    assert not spoilers, f"the page of {ex.id} shows lines of the reference fix outside its fold: {spoilers}"


def test_measurements_page_names_the_gpu(site):
    if not VERIFY.is_file():
        pytest.skip("no course/measurements/verify.json yet")
    report = json.loads(VERIFY.read_text(encoding="utf-8"))
    page = site / "measurements.html"
    assert page.is_file()
    assert report["gpu"] and normalize(report["gpu"]) in text_of(page)


def test_no_page_loads_from_the_internet(site):
    pages = list(site.rglob("*.html"))
    assert pages
    offenders = [
        f"{page.relative_to(site)}: {host}" for page in pages for host in EXTERNAL if host in page.read_text(encoding="utf-8")
    ]
    assert not offenders, "pages that need the internet: " + "; ".join(offenders)


def test_figures_and_snapshots_drawn_by_the_tools_are_on_their_pages(site):
    index = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))
    from oomlab.tools.snapshot.analysis import load_snapshot

    snapshots = 0
    for figure in index["figures"].values():
        page = exercise_page(site, figure["exercise"]).read_text(encoding="utf-8")
        for name in figure["files"]:
            assert (site / "figures" / name).is_file() and f"figures/{name}" in page, name
        if figure.get("snapshot"):
            snapshots += 1
            path = site / "figures" / figure["snapshot"]
            assert f'href="../figures/{figure["snapshot"]}"' in page, "the snapshot is not linked from its page"
            assert load_snapshot(path)["segments"], f"{path.name} holds no segments"
    assert snapshots, "no exercise offers its allocator snapshot"


def test_figures_json_keeps_the_profile_tools_failed_step_as_figures_that_its_headline_says_in_words():
    """``failure`` is the profile tool's own data, the figures its headline printed: a page reads those, not the words."""
    from oomlab.units import format_bytes

    figures = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))["figures"]
    failed = 0
    for name, figure in figures.items():
        assert "failure" in figure, f"{name}: figures.json without the tool's failure (regenerate with `oomlab dev figures`)"
        failure, headline = figure["failure"], figure["headline"]
        if figure["tool"] != "profile" or failure is None:
            assert failure is None, f"{name}: only the profile tool records a failed step"
            assert " more with " not in headline, f"{name}: its headline names a failed step that figures.json lacks"
            continue
        assert isinstance(failure["live_bytes"], int), name
        if failure["request_bytes"] is not None:  # None where the error did not say how much it asked for
            asked = f"asking for {format_bytes(failure['request_bytes'])} more with {format_bytes(failure['live_bytes'])} live"
            assert asked in headline, f"{name}: its failure says {asked!r}, its headline {headline!r}"
            failed += 1
    assert failed, "no profiled run failed: the failed step's note is not tested"


def test_a_profiled_bugs_page_sets_its_failed_step_against_the_budget_and_the_runs_peak(site):
    from oomlab.units import format_bytes

    figures = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))["figures"]
    shown = 0
    for figure in figures.values():
        if not (figure["failure"] or {}).get("request_bytes"):
            continue
        live, request = figure["failure"]["live_bytes"], figure["failure"]["request_bytes"]
        text = text_of(exercise_page(site, figure["exercise"]))
        assert (
            f"The headline's {format_bytes(live)} is what was live in the step that failed, when it asked for "
            f"{format_bytes(request)} more: {format_bytes(live + request)}, over the"
        ) in text, figure["exercise"]
        shown += 1
    assert shown, "no page shows a failed step"


def test_an_exercise_page_shows_the_error_before_the_script_and_folds_what_gives_the_answer_away(site, course):
    report = json.loads((ROOT / "course" / "measurements" / "verify.json").read_text(encoding="utf-8"))
    messages = {row["id"]: (row.get("buggy") or {}).get("message") for row in report["exercises"]}
    figures = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))["figures"]
    found_in = {f["exercise"] for f in figures.values() if f.get("files")}
    checked = 0
    for ex in course.exercises:
        page = exercise_page(site, ex.id).read_text(encoding="utf-8")
        if messages.get(ex.id):
            flat = " ".join(page.split())
            error = flat.find(html.escape(" ".join(messages[ex.id].split()[:6]), quote=False))
            assert flat.find('id="what-you-will-see"') < error < flat.find('id="the-script'), (
                f"{ex.id}: the error is not above the script"
            )
            checked += 1
        if ex.id in found_in:
            finding = page.index("What it found, with the pictures")
            assert page.rfind("<details", 0, finding) > page.rfind("</details>", 0, finding), (
                f"{ex.id}: the finding is not folded"
            )
            assert "<img" not in page[: page.rfind("<details", 0, finding)], f"{ex.id}: a picture is shown above its fold"
    assert checked, "no exercise page has a recorded error to show"


def test_exercise_pages_say_what_each_threshold_means(site, course):
    """A check's settings (tolerance, slack_mib, max, rtol) come with the limit the grader computes from them."""
    from oomlab.grading.checks import CHECKS, RelativeBytes

    for ex in course.scripts:  # an estimate's tolerances: tests/test_estimate_exercises.py
        text = text_of(exercise_page(site, ex.id))
        assert "Passes when" in text
        for name, params in ex.checks.items():
            check = CHECKS[name]
            if isinstance(check, RelativeBytes) and "tolerance" in params:
                assert f"plus {params['tolerance']:.0%}" in text, f"{ex.id}: {name}'s tolerance is not explained"
            if isinstance(check, RelativeBytes) and params.get("slack_mib"):
                assert "max(reference ×" in text, f"{ex.id}: {name}'s slack is not explained"


def test_every_fact_marker_is_rendered(site):
    """No marker survives the build; with facts.json committed, no hand-written page says 'not measured yet'."""
    measured = (ROOT / "course" / "measurements" / "facts.json").is_file()
    for page in site.rglob("*.html"):
        raw = page.read_text(encoding="utf-8")
        assert "oomlab:fact" not in raw, f"{page.relative_to(site)} still holds a fact marker"
        if measured:
            assert "not measured yet" not in text_of(page), f"{page.relative_to(site)} shows a fact as not measured"


def test_measurements_page_shows_how_long_a_learner_waits_and_whether_forked_runs_equal_fresh_ones(site):
    text = text_of(site / "measurements.html")
    speed = ROOT / "course" / "measurements" / "speed.json"
    if speed.is_file():
        report = json.loads(speed.read_text(encoding="utf-8"))
        for row in report["exercises"] + report.get("scripts", []):
            assert row["id"] in text and f"{row['diagnose_s']:.1f}" in text
        assert all(f"{row['recheck_warm_s']:.1f}" in text for row in report["exercises"])
        if "class" in report:
            row = report["class"]
            assert (
                f"for a class of {row['students']} ({row['notebooks']} notebooks" in text and f"{row['wall_s']} s in all" in text
            )
        assert "class_of" not in text and "_under_" not in text, "a target is shown by its key, not in words"
    else:
        assert "Not timed yet: on a CUDA GPU, make bench" in text
    equivalence = ROOT / "course" / "measurements" / "equivalence.json"
    if equivalence.is_file():
        table = json.loads(equivalence.read_text(encoding="utf-8"))
        equal = sum(row["equal"] for row in table["rows"])
        assert f"Of {table['runs']} runs, {equal} gave the same verdict" in text
    else:
        assert "Not compared yet" in text


def test_each_exercise_page_draws_its_measured_runs_against_its_budget(site, course):
    from oomlab.units import format_bytes

    report = json.loads(VERIFY.read_text(encoding="utf-8"))
    for row in (r for r in report["exercises"] if r.get("kind") != "estimate"):  # an estimate has no budget
        ex = course.get(row["id"])
        svg = re.search(r'<svg class="oomlab-chart".*?</svg>', exercise_page(site, ex.id).read_text(encoding="utf-8"), re.S)
        assert svg, f"{ex.id}: no picture of its runs"
        assert f"budget {format_bytes(ex.budget_bytes)}" in svg[0]
        for label, run in (("buggy script", row["buggy"]), ("reference solution", row["solution"])):
            assert f"{label}: peak allocated {format_bytes(run['peak_allocated'])}" in svg[0], f"{ex.id}: {label}"


def test_each_module_has_a_page_on_the_path_with_its_exercises_and_interview_questions(site, course):
    index = (site / "index.html").read_text(encoding="utf-8")
    modules = [m for m in course.modules if any(ex.module == m for ex in course.exercises)]
    assert modules, "no module has exercises"
    for number, module in enumerate(modules, 1):
        page = site / "modules" / f"{module.name}.html"
        assert page.is_file(), f"module {module.name} has no page"
        text = text_of(page)
        assert f"Module {number} of {len(modules)}" in text and first_words(module.goal, 5)[1:] in text
        for ex in (e for e in course.exercises if e.module == module):
            question = normalize(ex.interview.question.replace("`", ""))
            assert ex.title in text and question in text, f"{ex.id} is not on the page of {module.name}"
            assert f'href="../exercises/{ex.id}.html#in-an-interview"' in page.read_text(encoding="utf-8")
        assert f'href="modules/{module.name}.html"' in index, f"the landing page does not lead to module {module.name}"
        assert f'href="../modules/{module.name}.html"' in (site / "exercises" / f"{course.exercises[0].id}.html").read_text(
            encoding="utf-8"
        ), "the navigation does not hold the module pages"


def test_the_workflow_page_draws_every_step_with_its_question_and_remedy(site):
    from oomlab.steps import STEPS

    raw = (site / "workflow.html").read_text(encoding="utf-8")
    svg = re.search(r'<svg class="oomlab-diagram".*?</svg>', raw, re.S)
    assert svg, "the workflow page has no diagram"
    drawn = normalize(html.unescape(" ".join(re.findall(r">([^<>]+)</text>", svg[0]))))
    for s in STEPS:
        assert s.question and s.remedy, f"step {s.name} has no question or remedy to draw"
        assert all(normalize(part) in drawn for part in (s.heading, s.question, s.remedy)), f"step {s.name} is not drawn"
    assert drawn.index(STEPS[0].heading) < drawn.index(STEPS[-1].heading)


def test_the_command_reference_is_a_page_of_the_site(site):
    text = text_of(site / "cli.html")
    assert "Command reference" in text and "oomlab check" in text and "oomlab nbgrader autograde" in text


def test_a_hand_written_page_shows_a_drawn_figure_through_its_marker(site):
    figures = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))["figures"]
    drawn = {f for figure in figures.values() for f in figure.get("files") or []}
    raw = (site / "allocator.html").read_text(encoding="utf-8")
    assert "oomlab:figure" not in raw
    for name in ("ragged-batches-bug-segments.png", "ragged-batches-fix-segments.png"):
        assert (f'src="figures/{name}"' in raw) == (name in drawn), name
        assert (f"The picture {name} is not drawn yet" in text_of(site / "allocator.html")) == (name not in drawn)


def test_the_production_page_shows_the_probes_own_lines_that_wire_the_monitor_and_ask_the_policy(site):
    """The page includes lines of course/probes/worker_uptime.py by number: a probe edited around them must move them."""
    text = re.sub(r"<[^>]+>", "", (site / "production.html").read_text(encoding="utf-8"))
    for line in ("AllocatorMonitor(device=0, registry=registry)", "policy = RestartPolicy(", "decision = policy.decide("):
        assert html.unescape(text).count(line) >= 1, f"production.md no longer shows `{line}`: fix its --8<-- line numbers"


def test_the_sitemap_lists_every_page_once_the_published_address_is_given(tmp_path, site):
    """No address is invented: without OOMLAB_SITE_URL the sitemap is empty; with it, it lists every page there."""
    import os
    import subprocess
    import sys

    assert "<loc>" not in (site / "sitemap.xml").read_text(encoding="utf-8")
    env = {**os.environ, "OOMLAB_SITE_URL": "https://courses.example/oomlab/", "NO_MKDOCS_2_WARNING": "1"}
    out = tmp_path / "published"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html") if p.name != "404.html")
    listed = sorted(
        re.findall(r"<loc>https://courses\.example/oomlab/([^<]*)</loc>", (out / "sitemap.xml").read_text(encoding="utf-8"))
    )
    assert listed == pages


def test_the_measurements_page_shows_what_the_tools_cost_and_says_which_timings_are_not_the_current_courses(site):
    speed = json.loads((ROOT / "course" / "measurements" / "speed.json").read_text(encoding="utf-8"))
    verify = json.loads((ROOT / "course" / "measurements" / "verify.json").read_text(encoding="utf-8"))
    text = text_of(site / "measurements.html")
    hook, big = speed["oom_hook"], speed["big_snapshot"]
    assert "What the OOM hook costs" in text and f"{hook['steps']} optimizer steps each" in text
    for loop in hook["loops"].values():
        assert f"{loop['history_on']['median_step_ms']:.2f} ms (p90 {loop['history_on']['p90_step_ms']:.2f})" in text
    assert f"writing the report took {hook['at_oom']['report_s']:.2f} s" in text
    assert "The snapshot tool on a big snapshot" in text and f"{big['events']:,} history events" in text
    timed_now = speed["verify_runs"] == verify["runs"]
    assert ("not timed on this course" in text) != timed_now
    if not timed_now:
        assert f"it has {verify['runs']} now" in text and f"ran them in {verify['wall_s']} s" in text


def test_every_exercise_page_folds_what_its_fix_changed_after_the_fix(site, course):
    from oomlab.site.compare_fold import COMPARE_FOLD
    from oomlab.site.exercise_page import FIX_FOLD

    compares = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))["compares"]
    assert sorted(compares) == sorted(ex.id for ex in course.scripts), "oomlab dev figures compares every exercise"
    for ex in course.scripts:
        entry, page = compares[ex.id], exercise_page(site, ex.id).read_text(encoding="utf-8")
        fold = page.index(COMPARE_FOLD)
        assert page.index(FIX_FOLD) < fold, f"{ex.id}: the comparison gives the fix away, so it comes after it"
        assert page.rfind("<details", 0, fold) > page.rfind("</details>", 0, fold), f"{ex.id}: the comparison is not folded"
        assert normalize(entry["headline"]) in text_of(exercise_page(site, ex.id)), ex.id
        for name in entry["files"]:
            assert (site / "figures" / name).is_file() and f'src="../figures/{name}"' in page, name
        assert "/home/" not in json.dumps(entry) and "/tmp/" not in json.dumps(entry), f"{ex.id}: a machine's path"


def test_figures_json_keeps_of_each_comparison_what_the_compare_tool_says_may_be_shared():
    """Each part of a comparison with the keys the compare tool lists, none missing and none more."""
    from oomlab.tools.compare.analysis import shareable

    compares = json.loads((ROOT / "course" / "figures" / "figures.json").read_text(encoding="utf-8"))["compares"]
    for ex_id, entry in compares.items():
        assert entry["exercise"] == ex_id and entry["files"], ex_id
        kept = {k: v for k, v in entry.items() if k not in ("exercise", "files")}
        assert kept == shareable(kept), f"{ex_id}: its comparison has other keys than the compare tool shares"


def test_no_page_shows_a_backslash_escape_in_its_text(site):
    """An admonition title takes no escapes: ``"What does \\"Tried to allocate\\" report?"`` showed the backslashes."""
    shown = []
    for page in site.rglob("*.html"):
        text = text_of(page)
        shown += [f"{page.relative_to(site)}: ...{m.group(0)}..." for m in re.finditer(r'.{0,30}\\".{0,30}', text)]
    assert not shown, shown[:5]


def test_every_drawn_picture_opens_full_size(site):
    """The tools draw for a wide screen; in a page's column their labels are small, so a click opens each at full size."""
    shown = 0
    for page in site.rglob("*.html"):
        raw = page.read_text(encoding="utf-8")
        for src in re.findall(r'<img [^>]*src="([^"]*figures/[^"]+\.png)"', raw):
            shown += 1
            assert re.search(rf'<a href="{re.escape(src)}"[^>]*>\s*<img [^>]*src="{re.escape(src)}"', raw), (
                f"{page.relative_to(site)}: {src} does not open full size"
            )
    assert shown, "no page shows a drawn picture"


def test_the_allocator_page_draws_split_merge_and_expandable_segments(site):
    raw = (site / "allocator.html").read_text(encoding="utf-8")
    assert "oomlab:diagram" not in raw
    labels = [html.unescape(label) for label in re.findall(r'<svg class="oomlab-diagram"[^>]*aria-label="([^"]+)"', raw)]
    assert any("Split, pin and merge" in label for label in labels), "no split-and-merge diagram"
    assert any("expandable segments" in label for label in labels), "no expandable-segments diagram"


def test_an_exercise_pages_chart_and_table_show_the_same_runs(site, course):
    """The chart of measured runs and the table under it list the same runs, accepted alternatives included."""
    report = json.loads(VERIFY.read_text(encoding="utf-8"))
    with_alternatives = 0
    for row in report["exercises"]:
        raw = exercise_page(site, row["id"]).read_text(encoding="utf-8")
        chart = re.search(r'<svg class="oomlab-chart".*?</svg>', raw, re.S)
        if not chart:
            continue
        charted = [html.unescape(t) for t in re.findall(r'font-weight="bold">([^<]+)</text>', chart[0])]
        table = raw[chart.end() :]
        rows = [html.unescape(r) for r in re.findall(r"<tr>\s*<td>([^<]+)</td>", table[: table.index("</table>")])]
        assert charted == rows, f"{row['id']}: the chart shows {charted}, its table {rows}"
        with_alternatives += any(label.startswith("accepted fix: ") for label in rows)
    assert with_alternatives, "no exercise page shows an accepted alternative's run"


def test_an_exercise_met_before_its_step_is_tagged_to_read_the_error_first(site, course):
    """The workflow is learned in its own order: module 1's exercises drill reading the numbers, their step comes later."""
    from oomlab.course.modules import met_before_its_step
    from oomlab.steps import step

    order = [m.name for m in course.modules]
    early = [ex for ex in course.scripts if met_before_its_step(ex.module, ex.step)]
    assert early, "no exercise comes before the module that teaches its step"
    assert all(order.index(ex.module.name) < order.index(ex.step) for ex in early)
    for ex in course.scripts:
        text = text_of(exercise_page(site, ex.id))
        start = text.index("Workflow step: ") + len("Workflow step: ")
        tag = text[start : text.index(first_words(ex.summary, 3), start)].strip()
        want = f"Read the error first, then {step(ex.step).heading}." if ex in early else f"{step(ex.step).heading}."
        assert tag == want, f"{ex.id}: {tag}"
        module_page = text_of(site / "modules" / f"{ex.module.name}.html")
        assert (f"Read the error first, then {step(ex.step).heading}" in module_page) == (ex in early), ex.id
    first_module = text_of(site / "modules" / f"{course.modules[0].name}.html")
    assert "3. Profile the peak |" not in first_module


def test_the_path_says_what_each_module_asks_of_the_learner_and_of_the_gpu(site, course):
    """How long a module takes: the lines to read, counted at build, and the GPU's time of its bugs and fixes, from verify.json."""
    from oomlab.site.module_pages import taught

    text = text_of(site / "index.html")
    verify = json.loads((ROOT / "course" / "measurements" / "verify.json").read_text(encoding="utf-8"))
    walls = {row["id"]: row["buggy"]["wall_s"] + row["solution"]["wall_s"] for row in verify["exercises"]}
    for module, chosen in taught(course.exercises):
        lines = sum(len(ex.learner_path.read_text(encoding="utf-8").splitlines()) for _, ex in chosen)
        row = text[text.index(module.goal[:40]) :]
        assert f"{lines:,} lines of script" in row[:600], module.name
        seconds = sum(walls[ex.id] for _, ex in chosen)
        assert f"{seconds:.0f} s of GPU runs for the bug and the fix" in row[:800], module.name
