"""The myths page (course/myths.md): every claim has a verdict and evidence, and its summary table agrees.

Each ``##`` section of the page checks one claim (or a few related ones) of the course's seed
articles. The checks: (a) every section has one ``**Verdict:**`` line with an allowed verdict;
(b) every section whose verdict is not "Not measured here" cites evidence, a fact marker or a
link to a course page or to PyTorch's source or documentation; (c) every fact marker names a
key that ``course/measurements/facts.json`` holds; (d) the summary table above the sections lists
every section, in page order, with the same verdict. Each check is also run on a copy of the page
broken on purpose, to show that it fails when it should. Runs on CPU, reads files only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from oomlab.course import reports
from oomlab.site import facts

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "course" / "myths.md"
COURSE = ROOT / "course"
VERDICTS = ("Holds", "Partly", "Folklore", "Not measured here")
UNMEASURED = "Not measured here"
GENERATED_PAGES = {"measurements.md"}  # written at build time by oomlab/site/measurements_page.py, not files in course/
# PyTorch's source on GitHub, or its documentation (the same rule as tests/test_facts.py).
PYTORCH = re.compile(r"^https://(github\.com/pytorch/pytorch/(blob|tree)/|pytorch\.org/docs/|docs\.pytorch\.org/)")

HEADING = re.compile(r"^##\s+(?P<title>.+?)(?:\s*\{#(?P<id>[\w-]+)\})?\s*$")
VERDICT_LINE = re.compile(r"^\*\*Verdict:\*\*\s*(?P<verdict>.*?)\s*$")
TABLE_ROW = re.compile(r"^\|\s*\[(?P<claim>[^\]]+)\]\(#(?P<id>[\w-]+)\)\s*\|(?P<rest>.*)\|\s*$")
INLINE_LINK = re.compile(r"\]\((?P<url>[^)\s]+)\)")
REFERENCE_LINK = re.compile(r"\]\[(?P<label>[^\]]+)\]")
DEFINITION = re.compile(r"^\[(?P<label>[^\]]+)\]:\s*(?P<url>\S+)", flags=re.M)


@dataclass(frozen=True)
class Section:
    title: str
    anchor: str | None
    body: str


def without_code(markdown: str) -> str:
    """The page with fenced code blocks blanked out (a ``##`` in code is not a heading)."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", markdown, flags=re.S | re.M)


def split(markdown: str) -> tuple[str, list[Section]]:
    """The text before the first ``##`` heading, and the sections."""
    intro: list[str] = []
    sections: list[tuple[str, str | None, list[str]]] = []
    for line in without_code(markdown).splitlines():
        m = HEADING.match(line)
        if m:
            sections.append((m.group("title"), m.group("id"), []))
        elif sections:
            sections[-1][2].append(line)
        else:
            intro.append(line)
    return "\n".join(intro), [Section(title, anchor, "\n".join(body)) for title, anchor, body in sections]


def verdicts_of(section: Section) -> list[str]:
    return [m.group("verdict") for line in section.body.splitlines() if (m := VERDICT_LINE.match(line.strip()))]


def verdict(section: Section) -> str | None:
    found = verdicts_of(section)
    return found[0] if len(found) == 1 and found[0] in VERDICTS else None


def links(text: str, definitions: dict[str, str]) -> list[str]:
    inline = [m.group("url") for m in INLINE_LINK.finditer(text)]
    referenced = [definitions.get(m.group("label").lower(), "") for m in REFERENCE_LINK.finditer(text)]
    return inline + referenced


def is_course_page(url: str) -> bool:
    """A link to a page of the course site: a Markdown page in course/, an exercise page, or a generated page."""
    if "://" in url or url.startswith(("#", "mailto:")):
        return False
    path = url.split("#", 1)[0]
    if not path.endswith(".md"):
        return False
    if path in GENERATED_PAGES or (COURSE / path).is_file():
        return True
    m = re.fullmatch(r"exercises/([\w-]+)\.md", path)
    return bool(m) and (ROOT / "exercises" / m.group(1) / "exercise.toml").is_file()


# --------------------------------------------------------------------------- the checks: each returns its problems


def verdict_problems(markdown: str) -> list[str]:
    """(a) Every section has exactly one verdict line, with an allowed verdict."""
    _, sections = split(markdown)
    problems = [] if sections else ["the page has no ## sections"]
    for s in sections:
        found = verdicts_of(s)
        if len(found) != 1:
            problems.append(f"{s.title!r}: {len(found)} **Verdict:** lines, not one")
        elif found[0] not in VERDICTS:
            problems.append(f"{s.title!r}: verdict {found[0]!r} is not one of {', '.join(VERDICTS)}")
    return problems


def evidence_problems(markdown: str) -> list[str]:
    """(b) Every section with a verdict other than "Not measured here" cites a fact, a course page or PyTorch."""
    definitions = {m.group("label").lower(): m.group("url") for m in DEFINITION.finditer(markdown)}
    _, sections = split(markdown)
    problems = []
    for s in sections:
        if verdict(s) == UNMEASURED:
            continue
        body = DEFINITION.sub("", s.body)  # the page's link definitions follow its last section
        cited = facts.MARKER.search(body) or any(is_course_page(url) or PYTORCH.match(url) for url in links(body, definitions))
        if not cited:
            problems.append(f"{s.title!r} ({verdict(s)}): no fact marker and no link to a course page or to PyTorch")
    return problems


def marker_problems(markdown: str) -> list[str]:
    """(c) Every fact marker names a probe and a key whose value facts.json holds."""
    report = facts.load(ROOT / reports.FACTS)
    if report is None:
        return [f"there is no {reports.FACTS}: `{facts.COMMAND}` on a CUDA GPU writes it"]
    probes = {p.name: p for p in facts.find_probes(ROOT / facts.PROBES_DIR)}
    problems = []
    for name in facts.MARKER.findall(markdown):
        try:
            value = facts.lookup(report, name, probes)
            if value is facts.NOT_MEASURED:
                problems.append(f"{name}: its probe has no results in {reports.FACTS}")
            else:
                facts.format_value(name, value)  # raises UnknownFact for a value that is not a single figure
        except facts.UnknownFact as err:
            problems.append(str(err))
    return problems


def table_problems(markdown: str) -> list[str]:
    """(d) The summary table lists every section, in page order, each with the verdict its section gives."""
    intro, sections = split(markdown)
    rows = []
    for line in intro.splitlines():
        m = TABLE_ROW.match(line.strip())
        if m:
            cells = [c.strip() for c in m.group("rest").split("|")]
            rows.append((m.group("id"), cells[-1]))
    problems = [] if rows else ["no summary table of claims before the first section"]
    missing_ids = [s.title for s in sections if not s.anchor]
    problems += [f"{title!r} has no {{#id}} for the table to link to" for title in missing_ids]
    listed = [anchor for anchor, _ in rows]
    in_page = [s.anchor for s in sections if s.anchor]
    problems += [f"#{a} is a section but not in the table" for a in in_page if a not in listed]
    problems += [f"#{a} is in the table but is no section" for a in listed if a not in in_page]
    if not problems and listed != in_page:
        problems.append("the table does not list the sections in page order")
    by_anchor = {s.anchor: verdict(s) for s in sections}
    for anchor, table_verdict in rows:
        if anchor in by_anchor and by_anchor[anchor] != table_verdict:
            problems.append(f"#{anchor}: the table says {table_verdict!r}, its section {by_anchor[anchor]!r}")
    return problems


# --------------------------------------------------------------------------- the page


@pytest.fixture(scope="module")
def page() -> str:
    assert PAGE.is_file(), f"{PAGE.relative_to(ROOT)} is missing"
    return PAGE.read_text(encoding="utf-8")


def test_every_claim_has_one_allowed_verdict(page):
    problems = verdict_problems(page)
    assert not problems, "\n  ".join(["myths.md:", *problems])


def test_every_judged_claim_cites_evidence(page):
    problems = evidence_problems(page)
    assert not problems, "\n  ".join(["myths.md:", *problems])


def test_every_fact_marker_names_a_measured_key(page):
    assert facts.MARKER.search(page), "myths.md quotes no measured fact"
    problems = marker_problems(page)
    assert not problems, "\n  ".join(["myths.md:", *problems])


def test_the_summary_table_lists_every_claim_with_its_verdict(page):
    problems = table_problems(page)
    assert not problems, "\n  ".join(["myths.md:", *problems])


# --------------------------------------------------------------------------- each check fails on a broken page


def first_judged_section(markdown: str) -> Section:
    _, sections = split(markdown)
    return next(s for s in sections if verdict(s) not in (None, UNMEASURED))


def strip_evidence(markdown: str) -> str:
    """The page with the first judged section's markers removed and its links turned into plain text."""
    body = first_judged_section(markdown).body
    bare = facts.MARKER.sub("a figure", body)
    bare = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", bare)
    bare = re.sub(r"\[([^\]]+)\]\[[^\]]+\]", r"\1", bare)
    return markdown.replace(body, bare, 1)


def link_elsewhere(markdown: str) -> str:
    """The page with the first judged section's evidence replaced by a link to a page the course does not have."""
    stripped = strip_evidence(markdown)
    body = first_judged_section(stripped).body
    return stripped.replace(body, body + "\nSee [another page](no-such-page.md) and [a site](https://example.com/).", 1)


def first_table_row(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if TABLE_ROW.match(line.strip()))


def first_marker(markdown: str) -> str:
    return facts.MARKER.search(markdown).group(1)


BREAKAGES: list[tuple[str, Callable[[str], list[str]], Callable[[str], str]]] = [
    (
        "a verdict outside the list",
        verdict_problems,
        lambda t: re.sub(r"\*\*Verdict:\*\* \w+", "**Verdict:** Mostly", t, count=1),
    ),
    ("a section without a verdict", verdict_problems, lambda t: re.sub(r"^\*\*Verdict:\*\*.*$", "", t, count=1, flags=re.M)),
    (
        "a section with two verdicts",
        verdict_problems,
        lambda t: re.sub(r"^(\*\*Verdict:\*\*.*)$", r"\1\n\n\1", t, count=1, flags=re.M),
    ),
    ("a judged claim without evidence", evidence_problems, strip_evidence),
    ("evidence that links to no course page", evidence_problems, link_elsewhere),
    (
        "a marker for a key facts.json lacks",
        marker_problems,
        lambda t: t.replace(first_marker(t), "fragmentation.defaults.no_such_key", 1),
    ),
    ("a marker for a probe that does not exist", marker_problems, lambda t: t.replace(first_marker(t), "no_such_probe.key", 1)),
    (
        "a marker for a group of keys, not one value",
        marker_problems,
        lambda t: t.replace(first_marker(t), "fragmentation.defaults", 1),
    ),
    (
        "a table row with another verdict",
        table_problems,
        lambda t: t.replace(first_table_row(t), re.sub(r"\|\s*[^|]+\|\s*$", "| Folklore-ish |", first_table_row(t)), 1),
    ),
    ("a section missing from the table", table_problems, lambda t: t.replace(first_table_row(t) + "\n", "", 1)),
    (
        "a section without an id",
        table_problems,
        lambda t: re.sub(r"^(##\s+.+?)\s*\{#[\w-]+\}\s*$", r"\1", t, count=1, flags=re.M),
    ),
]


@pytest.mark.parametrize(("what", "check", "breakage"), BREAKAGES, ids=[b[0] for b in BREAKAGES])
def test_each_check_fails_on_a_broken_page(page, what, check, breakage):
    broken = breakage(page)
    assert broken != page, f"the breakage ({what}) did not change the page"
    assert not check(page), f"{check.__name__} already fails on the real page"
    assert check(broken), f"{check.__name__} does not notice {what}"
