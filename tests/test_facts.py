"""Measured facts: the probes' plumbing, the pages' fact markers, and the rule that every figure is measured or cited.

The rule (see :mod:`oomlab.site.facts`): every number the hand-written pages state comes from
a committed measurement that a command regenerates on a GPU (a fact marker, rendered from
``course/measurements/facts.json``), or sits in a sentence that cites PyTorch's source or
documentation, or is one of a few definitional constants of the allocator that the allocator
page cites. Runs on CPU: the probes here are fakes that print JSON.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oomlab.course import reports
from oomlab.errors import OomLabError
from oomlab.site import facts
from oomlab.site import reports as site_reports
from oomlab.units import MIB, UNIT_BYTES
from tests.in_process import oomlab

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "course").glob("*.md"))
PROBES = ROOT / facts.PROBES_DIR
FACTS_JSON = ROOT / reports.FACTS


# --------------------------------------------------------------------------- the command's plumbing

ECHO = """
import json, os, sys
print("something a library printed")
print(json.dumps({
    "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    "other_conf": os.environ.get("PYTORCH_ALLOC_CONF"),
    "variant": os.environ.get("OOMLAB_PROBE_VARIANT"),
    "pid": os.getpid(),
    "size_bytes": 12 << 20,
}))
"""


def write_probe(folder: Path, name: str, alloc_conf: str, body: str = ECHO) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(f'"""A fake probe."""\n\nALLOC_CONF = {alloc_conf}\n' + textwrap.dedent(body), encoding="utf-8")
    return path


def test_measure_runs_every_probe_and_variant_in_a_fresh_process_with_its_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")  # the shell's settings never reach a probe
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.9")
    folder = tmp_path / "probes"
    write_probe(folder, "variants", '{"defaults": "", "expandable": "expandable_segments:True"}')
    single = write_probe(folder, "single", '"max_split_size_mb:64"')
    (folder / "_helper.py").write_text("X = 1\n", encoding="utf-8")  # helpers are not probes

    probes = facts.find_probes(folder)
    assert [p.name for p in probes] == ["single", "variants"]
    report = facts.measure(probes, cwd=tmp_path)

    assert set(report) >= {"gpu", "torch", "cuda", "created", "facts", "sources"}
    assert "errors" not in report
    variants = report["facts"]["variants"]
    assert variants["defaults"]["conf"] is None and variants["expandable"]["conf"] == "expandable_segments:True"
    assert [variants[v]["variant"] for v in ("defaults", "expandable")] == ["defaults", "expandable"]
    assert report["facts"]["single"]["conf"] == "max_split_size_mb:64" and report["facts"]["single"]["variant"] is None
    assert all(r["other_conf"] is None for r in (*variants.values(), report["facts"]["single"]))
    pids = {variants["defaults"]["pid"], variants["expandable"]["pid"], report["facts"]["single"]["pid"], os.getpid()}
    assert len(pids) == 4, "every run is its own process"
    assert report["sources"]["single"] == facts.source_hash(single) and len(report["sources"]["single"]) == 16

    out = tmp_path / "measurements" / "facts.json"
    facts.write(report, out)
    written = facts.load(out)
    assert written["facts"] == report["facts"] and written["sources"] == report["sources"]
    assert facts.stale_probes(written, probes) == []
    single.write_text(single.read_text(encoding="utf-8") + "# changed\n", encoding="utf-8")
    assert facts.stale_probes(written, facts.find_probes(folder)) == ["single"]


def test_only_the_stale_probes_run_and_their_facts_are_merged_into_the_committed_ones(course_copy, monkeypatch, capsys):
    """`oomlab dev facts --stale`: a probe added or changed since the report costs its own run, not every probe's."""
    monkeypatch.setattr(facts, "environment", lambda cwd: {"gpu": "GPU A", "torch": "2.11", "cuda": "13.0"})
    monkeypatch.setenv("OOMLAB_ROOT", str(course_copy))
    folder = course_copy / facts.PROBES_DIR
    write_probe(folder, "kept", '""')
    changed = write_probe(folder, "changed", '""')
    gone = write_probe(folder, "gone", '""')
    out = course_copy / "facts.json"
    facts.write(facts.measure(facts.find_probes(folder), cwd=course_copy), out)
    before = facts.load(out)
    changed.write_text(changed.read_text(encoding="utf-8") + "# changed\n", encoding="utf-8")
    gone.unlink()
    write_probe(folder, "added", '""')

    rc, said = oomlab(capsys, "dev", "facts", "--stale", "--json", str(out))
    after = facts.load(out)
    assert rc == 0 and "Stale: added, changed" in said, said
    assert after["facts"]["kept"] == before["facts"]["kept"]  # not run again: the same process's answer
    assert after["facts"]["changed"]["pid"] != before["facts"]["changed"]["pid"]
    assert set(after["facts"]) == set(after["sources"]) == {"kept", "changed", "added"}  # a removed probe's facts go
    assert facts.stale_probes(after, facts.find_probes(folder)) == []
    rc, said = oomlab(capsys, "dev", "facts", "--stale", "--json", str(out))
    assert rc == 0 and "nothing to run" in said and facts.load(out) == after

    # Facts of another machine are never set beside these: nothing is written.
    changed.write_text(changed.read_text(encoding="utf-8") + "# again\n", encoding="utf-8")
    monkeypatch.setattr(facts, "environment", lambda cwd: {"gpu": "GPU B", "torch": "2.11", "cuda": "13.0"})
    rc, said = oomlab(capsys, "dev", "facts", "--stale", "--json", str(out))
    assert rc == 2 and "measured with gpu GPU A; these with gpu GPU B" in said and facts.load(out) == after
    rc, said = oomlab(capsys, "dev", "facts", "--stale", "--probe", "kept")
    assert rc == 2 and "both choose the probes" in said


def test_a_failing_probe_is_reported_and_no_report_is_written(tmp_path):
    folder = tmp_path / "probes"
    write_probe(folder, "good", '""')
    write_probe(folder, "broken", '""', "raise SystemExit('no GPU here')\n")
    write_probe(folder, "silent", '""', "print('no JSON')\n")
    report = facts.measure(facts.find_probes(folder), cwd=tmp_path)
    assert set(report["errors"]) == {"broken", "silent"} and "no GPU here" in report["errors"]["broken"]
    assert list(report["facts"]) == ["good"]
    with pytest.raises(facts.ProbeFailed):
        facts.write(report, tmp_path / "facts.json")
    assert not (tmp_path / "facts.json").exists()


def test_a_probe_must_declare_its_allocator_settings(tmp_path):
    path = tmp_path / "probes" / "bare.py"
    path.parent.mkdir()
    path.write_text("print('{}')\n", encoding="utf-8")
    with pytest.raises(OomLabError, match="ALLOC_CONF"):
        facts.read_probe(path)


def test_the_course_probes_declare_their_settings_and_stay_small():
    probes = facts.find_probes(PROBES)
    assert probes, f"no probes in {facts.PROBES_DIR}"
    # Drafts (course/probes/drafts/: written, not yet run on a GPU) are held to the same rules, so that moving one
    # up into course/probes/ and running `oomlab dev facts --stale` is all it takes.
    for probe in [*probes, *facts.find_probes(PROBES / "drafts")]:
        assert probe.timeout_s <= 120, probe.name
        source = probe.path.read_text(encoding="utf-8")
        assert '__name__ == "__main__"' in source, f"{probe.name} runs on import"


# --------------------------------------------------------------------------- markers

REPORT = {
    "gpu": "Fake GPU",
    "torch": "2.99",
    "cuda": "13.0",
    "created": "2026-01-01T00:00:00+00:00",
    "facts": {
        "sizes": {"defaults": {"block_bytes": 12 << 20, "odd_bytes": MIB + 512, "small_pool": True, "named_fraction": 0.25}},
        "count": {"steps": 1234, "method": "nvml"},
    },
    "sources": {},
}


@pytest.fixture
def probes(tmp_path) -> dict:
    folder = tmp_path / "probes"
    for name in ("sizes", "count", "later"):
        write_probe(folder, name, '""')
    return {p.name: p for p in facts.find_probes(folder)}


def test_a_marker_renders_the_measured_value(probes):
    page = (
        "A <!-- oomlab:fact sizes.defaults.block_bytes --> segment, <!-- oomlab:fact sizes.defaults.odd_bytes -->, "
        "<!-- oomlab:fact sizes.defaults.small_pool -->, <!-- oomlab:fact sizes.defaults.named_fraction -->, "
        "<!-- oomlab:fact count.steps --> steps by <!-- oomlab:fact count.method -->."
    )
    text, shown = facts.render(page, REPORT, probes)
    assert text == "A 12.0 MiB segment, 1.0 MiB (1,049,088 bytes), yes, 25%, 1,234 steps by nvml."
    assert shown == [
        "sizes.defaults.block_bytes",
        "sizes.defaults.odd_bytes",
        "sizes.defaults.small_pool",
        "sizes.defaults.named_fraction",
        "count.steps",
        "count.method",
    ]


def test_a_marker_reads_not_measured_yet_before_the_probe_ran(probes):
    text, _ = facts.render("<!-- oomlab:fact sizes.defaults.block_bytes -->", None, probes)
    assert text == facts.NOT_MEASURED
    text, _ = facts.render("<!-- oomlab:fact later.anything -->", REPORT, probes)  # a new probe, not run yet
    assert text == facts.NOT_MEASURED


@pytest.mark.parametrize(
    "name, why",
    [
        ("nosuch.value_bytes", "no probe"),
        ("sizes.defaults.nosuch_bytes", "'nosuch_bytes' is not in the results"),
        ("sizes.defaults", "not a single value"),
        ("count", "name a key"),
    ],
)
def test_an_unknown_fact_is_an_error(probes, name, why):
    with pytest.raises(facts.UnknownFact, match=why):
        facts.render(f"<!-- oomlab:fact {name} -->", REPORT, probes)
    if why == "no probe":  # even before anything was measured
        with pytest.raises(facts.UnknownFact):
            facts.render(f"<!-- oomlab:fact {name} -->", None, probes)


@pytest.fixture(scope="module")
def site_copy(tmp_path_factory) -> Path:
    """The course's site sources in a folder of their own, to build with changes."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
    root = tmp_path_factory.mktemp("site-copy")
    for folder in ("exercises", "solutions"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "course", root / "course", ignore=shutil.ignore_patterns("figures", "__pycache__"))
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = config.replace("  - oomlab/site/hooks.py", f"  - {(ROOT / 'oomlab' / 'site' / 'hooks.py').as_posix()}")
    (root / "mkdocs.yml").write_text(config, encoding="utf-8")
    return root


def build(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(root / "site")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_an_unknown_fact_fails_the_build(site_copy):
    page = site_copy / "course" / "index.md"
    original = page.read_text(encoding="utf-8")
    # Before any measurement (no facts.json) a known probe's fact reads "not measured yet" and is no error (the
    # measured-fact test below builds the whole site with the course's facts unmeasured); an unknown one fails.
    known, unknown = "allocator_sizes.defaults.no_such_case", "no_such_probe.value_bytes"
    try:
        page.write_text(
            original + f"\nA figure: <!-- oomlab:fact {known} -->, <!-- oomlab:fact {unknown} -->\n", encoding="utf-8"
        )
        (site_copy / "course" / "measurements" / "facts.json").unlink(missing_ok=True)
        proc = build(site_copy)
        assert proc.returncode != 0 and f"unknown fact '{unknown}'" in proc.stdout + proc.stderr
        assert known not in proc.stdout + proc.stderr
    finally:
        page.write_text(original, encoding="utf-8")


@pytest.mark.parametrize(
    "marker, error",
    [
        ("<!-- oomlab:chart no-such-chart -->", "no chart named 'no-such-chart'"),
        ("<!-- oomlab:oom-message no-such-exercise -->", "names 'no-such-exercise', which is not an exercise"),
    ],
)
def test_a_marker_naming_nothing_fails_the_build(site_copy, marker, error):
    page = site_copy / "course" / "index.md"
    original = page.read_text(encoding="utf-8")
    try:
        page.write_text(original + f"\n{marker}\n", encoding="utf-8")
        proc = build(site_copy)
        assert proc.returncode != 0 and error in proc.stdout + proc.stderr
    finally:
        page.write_text(original, encoding="utf-8")


def test_a_measured_fact_shows_on_the_built_page_with_where_it_comes_from(site_copy):
    measurements = site_copy / "course" / "measurements" / "facts.json"
    probe = write_probe(site_copy / "course" / "probes", "fake_probe", '""')
    # Only the fake probe has results: every other marker of the course reads "not measured yet".
    report = {
        **REPORT,
        "facts": {"fake_probe": {"outside_bytes": 600 * MIB}},
        "sources": {"fake_probe": facts.source_hash(probe)},
    }
    page = site_copy / "course" / "index.md"
    original = page.read_text(encoding="utf-8")
    try:
        page.write_text(original + "\nOutside: <!-- oomlab:fact fake_probe.outside_bytes -->.\n", encoding="utf-8")
        facts.write(report, measurements)
        proc = build(site_copy)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        html = (site_copy / "site" / "index.html").read_text(encoding="utf-8")
        assert "Outside: 600.0 MiB." in html
        assert "Fake GPU" in html and "probes/fake_probe.py" in html
        assert facts.NOT_MEASURED.strip("*") in html, "the course's own facts are not in this report"
    finally:
        page.write_text(original, encoding="utf-8")
        measurements.unlink(missing_ok=True)
        probe.unlink()


# --------------------------------------------------------------------------- the rule

# A figure: a number with a unit of size, share, ratio or time ("512 bytes", "1-byte", "2.2 GiB", "57%", "4x", "10 s").
FIGURE = re.compile(
    r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?-?\s?(bytes?|B|KiB|MiB|GiB|TiB|KB|MB|GB)(?![\w])"
    r"|(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s?(%)|(x|×)(?!\w)|\s(s|ms)(?![\w]))"
)
# Where a citation may point: PyTorch's source on GitHub, or its documentation.
CITED = re.compile(r"^https://(github\.com/pytorch/pytorch/(blob|tree)/|pytorch\.org/docs/|docs\.pytorch\.org/)")
# Definitional constants of the caching allocator, quoted across pages without a citation each time. Each must
# appear, cited to the allocator's source, on the allocator page (test below): kMinBlockSize (512 bytes),
# kSmallSize (1 MiB), kSmallBuffer and kRoundLarge (2 MiB), kMinLargeAlloc (10 MiB), kLargeBuffer (20 MiB).
DEFINITIONAL = {
    512: "kMinBlockSize",
    MIB: "kSmallSize",
    2 * MIB: "kSmallBuffer",
    10 * MIB: "kMinLargeAlloc",
    20 * MIB: "kLargeBuffer",
}
UNITS = {**UNIT_BYTES, "byte": 1}


def definitions(markdown: str) -> dict[str, str]:
    """Reference-style link definitions: ``[label]: url``."""
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^\[([^\]]+)\]:\s*(\S+)", markdown, flags=re.M)}


def sentences(markdown: str):
    """The page's prose, sentence by sentence, outside code blocks, with its markers and code spans gone."""
    text = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M)  # fenced code
    text = re.sub(r"^\[[^\]]+\]:\s*\S+\s*$", "", text, flags=re.M)  # link definitions
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)  # fact and exercise markers: their figures are measured
    text = re.sub(r"\{#[\w-]+\}", "", text)  # heading ids
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.)\s)", text):  # paragraphs and list items
        block = " ".join(block.split())
        yield from (s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*_(\[])", block) if s)


def links(sentence: str, defs: dict[str, str]) -> list[str]:
    inline = re.findall(r"\]\((\S+?)\)", sentence)
    referenced = [defs.get(label.lower(), "") for label in re.findall(r"\]\[([^\]]+)\]", sentence)]
    return inline + referenced


def figures(sentence: str) -> list[tuple[str, int | None]]:
    """Each figure in a sentence's prose, with its size in bytes where it is a size."""
    prose = re.sub(r"`[^`]*`", "", sentence)  # code: settings and API names, not figures
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    out = []
    for m in FIGURE.finditer(prose):
        if m.group(2):
            out.append((m.group(0), round(float(m.group(1).replace(",", "")) * UNITS[m.group(2).lower()])))
        else:
            out.append((m.group(0), None))
    return out


def test_the_figure_finder_finds_figures():
    found = [
        f
        for f, _ in figures(
            "A 512-byte block, 2.2 GiB free, 57% of it, 4x more, in 10 s; `max_split_size_mb:128`; 3 steps, torch 2.4."
        )
    ]
    assert found == ["512-byte", "2.2 GiB", "57%", "4x", "10 s"]
    assert figures("11 MiB and 1 byte")[1][1] == 1 and figures("1,024 bytes")[0][1] == 1024


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_figure_on_a_hand_written_page_is_measured_or_cited(page):
    markdown = page.read_text(encoding="utf-8")
    defs = definitions(markdown)
    unbacked = []
    for sentence in sentences(markdown):
        cited = any(CITED.match(url) for url in links(sentence, defs))
        for figure, size in figures(sentence):
            if not cited and size not in DEFINITIONAL:
                unbacked.append(f"{figure!r} in: {sentence[:160]}")
    assert not unbacked, (
        f"{page.name} states figures that no committed measurement holds and no citation backs. Quote a probe's "
        "figure with <!-- oomlab:fact probe.key --> (course/probes/, `oomlab dev facts`), cite PyTorch's source or docs in "
        "the same sentence, or remove it:\n  " + "\n  ".join(unbacked)
    )


def test_the_definitional_constants_are_cited_on_the_allocator_page():
    markdown = (ROOT / "course" / "allocator.md").read_text(encoding="utf-8")
    defs = definitions(markdown)
    cited_sizes = {
        size
        for sentence in sentences(markdown)
        if any(CITED.match(url) for url in links(sentence, defs))
        for _, size in figures(sentence)
    }
    missing = [name for size, name in DEFINITIONAL.items() if size not in cited_sizes]
    assert not missing, f"allocator.md does not cite the allocator's source for: {', '.join(missing)}"


# --------------------------------------------------------------------------- the committed measurement


def test_facts_json_is_not_older_than_the_probes():
    report = facts.load(FACTS_JSON)
    if report is None:
        pytest.skip(f"no {reports.FACTS} yet: `{facts.COMMAND}` on a CUDA GPU writes it")
    probes = facts.find_probes(PROBES)
    stale = facts.stale_probes(report, probes)
    assert not stale, f"{reports.FACTS} was measured with older versions of: {', '.join(stale)}; run `{facts.COMMAND}` again"
    gone = sorted(set(report["sources"]) - {p.name for p in probes})
    assert not gone, f"{reports.FACTS} still holds probes that no longer exist: {', '.join(gone)}"
    assert report.get("gpu") and report.get("torch"), "facts.json does not say where it was measured"
    assert "errors" not in report


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_fact_marker_names_a_probe_and_a_measured_key(page):
    report = facts.load(FACTS_JSON)
    probes = {p.name: p for p in facts.find_probes(PROBES)}
    derived = site_reports.derived_facts([], report)  # from the manifests, the probes and the tools, by the site's hooks
    for name in facts.MARKER.findall(page.read_text(encoding="utf-8")):
        head, _, key = name.partition(".")
        if head in derived:
            assert key in derived[head], f"{page.name}: {name} is not one of the derived facts {sorted(derived[head])}"
            continue
        value = facts.lookup(report, name, probes)  # raises UnknownFact
        if value is not facts.NOT_MEASURED:
            facts.format_value(name, value)  # raises UnknownFact for a value that is not a single figure


@pytest.mark.parametrize(
    "value, shown",
    [(0.47, "47%"), (0.0, "0%"), (0.004, "under 1%"), (0.001, "under 1%"), (0.00099, "under 0.1%"), (1.29e-07, "under 0.0001%")],
)
def test_a_fraction_too_small_for_a_whole_percent_is_given_as_a_bound_not_as_zero(value, shown):
    assert facts.format_value("x.difference_fraction", value) == shown


@pytest.mark.parametrize(
    "name, value, shown",
    [
        ("x.card_bytes", 80_000_000_000, "74.5 GiB (80 GB)"),
        ("x.seventy_b.bf16_masters_adamw_bytes", 1_120_000_000_000, "1,043.1 GiB (1,120 GB)"),
        ("x.peak_bytes", 2_772_497_408, "2,644.1 MiB"),  # below a card's size: MiB, as every other figure
        ("x.seven_b_parameters", 7_000_000_000, "7 billion"),
        ("x.parameters", 33_570_816, "33,570,816"),
    ],
)
def test_a_model_or_a_cards_size_reads_as_it_is_asked_about(name, value, shown):
    assert facts.format_value(name, value) == shown
