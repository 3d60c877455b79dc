"""What the markers in a hand-written page of ``course/`` become when the site is built.

A page written by hand states no figure and draws no picture itself: it leaves a marker, and
:func:`render` puts in what the course measured or drew, so the page follows the course:

- ``<!-- oomlab:figure FILE alt -->``: a picture that ``oomlab dev figures`` drew (listed in
  ``figures.json``) or ``oomlab dev viewer-shots`` took (``viewer-shots.json``), or a line saying
  it is not drawn yet;
- ``<!-- oomlab:diagram NAME -->``: a diagram drawn at build time from the code (:data:`DIAGRAMS`:
  the workflow's, :mod:`oomlab.site.diagram`, and the segments', :mod:`oomlab.site.segments_diagram`);
- ``<!-- oomlab:modules -->``: the path through the course, module by module;
- ``<!-- oomlab:exercises -->``: a table of the exercises, and ``<!-- oomlab:exercises STEP -->``
  a list of those teaching STEP;
- ``<!-- oomlab:oom-message ID -->``: an exercise's recorded error, whole, clause by clause;
- ``<!-- oomlab:chart NAME -->``: a chart of what a probe measured (:mod:`oomlab.site.fact_charts`);
- ``<!-- oomlab:fact probe.key -->``: a figure that a probe script in ``course/probes/`` measured,
  from ``facts.json`` (:mod:`oomlab.site.facts`); the page then ends with where its measured
  figures come from. An unknown fact fails the build; one not measured yet reads "not measured
  yet", with the command that measures it.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

from oomlab.course.manifest import STEP_NAMES
from oomlab.site import facts as site_facts
from oomlab.site import segments_diagram
from oomlab.site.diagram import workflow_svg
from oomlab.site.exercise_page import recorded_error
from oomlab.site.fact_charts import CHART_MARKER, CHARTS, chart
from oomlab.site.markdown import link_from, picture
from oomlab.site.module_pages import exercise_table, modules_overview, page_uri
from oomlab.site.oom_message import annotated
from oomlab.site.reports import FACTS_JSON, PROBES, Reports, measured_date, measured_on
from oomlab.site.viewer_shots import PNG_SUFFIX

__all__ = ["DIAGRAMS", "render"]

EXERCISES_MARKER = re.compile(r"<!--\s*oomlab:exercises(?:\s+(\w+))?\s*-->")
MODULES_MARKER = "<!-- oomlab:modules -->"  # the path through the course, module by module
DIAGRAM_MARKER = re.compile(r"<!--\s*oomlab:diagram\s+([\w-]+)\s*-->")  # a picture drawn from the code below
DIAGRAMS = {"workflow": workflow_svg, **segments_diagram.DIAGRAMS}
# <!-- oomlab:figure FILE alt text --> in a hand-written page: a picture `oomlab dev figures` drew, once it has
FIGURE_MARKER = re.compile(r"<!--\s*oomlab:figure\s+(?P<file>[\w.-]+)\s+(?P<alt>.*?)\s*-->", re.S)
OOM_MESSAGE_MARKER = re.compile(r"<!--\s*oomlab:oom-message\s+([\w-]+)\s*-->")


def render(markdown: str, page_src_uri: str, reports: Reports) -> str:
    """The page with each of its markers replaced (a page without markers comes back as it was)."""
    if "oomlab:figure" in markdown:
        markdown = FIGURE_MARKER.sub(lambda m: figure_image(page_src_uri, m["file"], m["alt"], reports), markdown)
    if "oomlab:diagram" in markdown:
        markdown = DIAGRAM_MARKER.sub(lambda m: diagram(page_src_uri, m.group(1)), markdown)
    if MODULES_MARKER in markdown:
        markdown = markdown.replace(MODULES_MARKER, modules_overview(page_src_uri, reports.exercises, reports.verify))
    if "oomlab:exercises" in markdown:
        markdown = EXERCISES_MARKER.sub(lambda m: exercise_list(page_src_uri, m.group(1), reports), markdown)
    if "oomlab:oom-message" in markdown:
        markdown = OOM_MESSAGE_MARKER.sub(lambda m: oom_message_section(page_src_uri, m.group(1), reports), markdown)
    charted: list[str] = []
    if "oomlab:chart" in markdown:
        markdown = CHART_MARKER.sub(lambda m: chart_section(page_src_uri, m.group(1), charted, reports), markdown)
    if "oomlab:fact" in markdown or charted:
        markdown = render_facts(markdown, page_src_uri, charted, reports)
    return markdown


def facts_provenance(page_src_uri: str, shown: list[str], reports: Reports) -> list[str]:
    """The end of a page that quotes measured facts: where they come from, or that they are not measured yet."""
    probes = sorted({name.split(".", 1)[0] for name in shown if name.split(".", 1)[0] in reports.probes})
    if not probes:
        return []
    links = ", ".join(f"[`{p}.py`]({link_from(page_src_uri, f'{PROBES}/{p}.py')})" for p in probes)
    report = reports.facts
    md = ["", "## Where the measured figures come from", ""]
    if report is None:
        return md + [
            '!!! info "Not measured yet"',
            "",
            f"    The figures marked {site_facts.NOT_MEASURED} come from the probe scripts {links}. "
            f"`{site_facts.COMMAND}` runs each of them in a fresh process on a CUDA GPU and writes "
            "`course/measurements/facts.json`, which this page then quotes.",
            "",
        ]
    md += [
        f"The figures on this page that are not cited to PyTorch's source were measured by the probe scripts {links}: "
        f"`{site_facts.COMMAND}` ran each in a fresh process on {report.get('gpu') or 'an unknown GPU'}, torch "
        f"{report.get('torch') or '?'}, CUDA {report.get('cuda') or '?'}, {measured_date(report)}, and wrote "
        f"[`{FACTS_JSON}`]({link_from(page_src_uri, FACTS_JSON)}). They hold for that GPU and torch; "
        "run the probes on yours to compare.",
        "",
    ]
    stale = [p for p in site_facts.stale_probes(report, [reports.probes[p] for p in probes]) if p in probes]
    if stale:
        md += [
            '!!! warning "Measured with an older version of a probe"',
            "",
            f"    {', '.join(f'`{p}`' for p in stale)} changed since facts.json was written: run `{site_facts.COMMAND}` again.",
            "",
        ]
    return md


def render_facts(markdown: str, page_src_uri: str, charted: list[str], reports: Reports) -> str:
    """The page's fact markers as figures, and where the figures and the charts (their probes' names) come from."""
    try:
        markdown, shown = site_facts.render(markdown, reports.facts, reports.probes, reports.derived)
    except site_facts.UnknownFact as err:
        raise PluginError(f"{page_src_uri}: {err}") from None
    return markdown.rstrip("\n") + "\n" + "\n".join(facts_provenance(page_src_uri, [*shown, *charted], reports)) + "\n"


def chart_section(page_src_uri: str, name: str, charted: list[str], reports: Reports) -> str:
    """A chart marker as its picture, or a line saying that its probe has not run yet."""
    if name not in CHARTS:
        raise PluginError(f"course/{page_src_uri}: no chart named {name!r}; charts: {', '.join(sorted(CHARTS))}.")
    charted.append(CHARTS[name][0])
    svg = chart(name, reports.facts)
    return svg if svg is not None else f"*(Not drawn yet: `{site_facts.COMMAND}` runs `{CHARTS[name][0]}` on a GPU.)*"


def diagram(page_src_uri: str, name: str) -> str:
    """The diagram ``name``, drawn now from the code it pictures."""
    if name not in DIAGRAMS:
        raise PluginError(f"course/{page_src_uri}: no diagram {name!r}; the diagrams are {', '.join(DIAGRAMS)}.")
    return DIAGRAMS[name]()


def figure_image(page_src_uri: str, name: str, alt: str, reports: Reports) -> str:
    """A picture from course/figures/ that figures.json or viewer-shots.json lists, or a line saying what will draw it."""
    drawn = {f for figure in reports.figures.get("figures", {}).values() for f in figure.get("files") or []}
    drawn |= {shot.get("png") for shot in reports.viewer_shots.get("shots", [])}
    if name not in drawn:
        if name.endswith(PNG_SUFFIX):
            return f"*(The picture {name} is not drawn yet: `oomlab dev viewer-shots` takes it, no GPU needed.)*"
        return f"*(The picture {name} is not drawn yet: on a CUDA GPU, `oomlab dev figures` draws it.)*"
    return picture(page_src_uri, name, alt)


def exercise_list(page_src_uri: str, step_name: str | None, reports: Reports) -> str:
    """The exercises as a table, or those that teach ``step_name`` as a list to practise it."""
    exercises = reports.exercises
    if step_name is not None:
        if step_name not in STEP_NAMES:
            raise PluginError(
                f"{page_src_uri}: unknown step {step_name!r} in an oomlab:exercises marker; use one of {', '.join(STEP_NAMES)}."
            )
        chosen = [(n, ex) for n, ex in enumerate(exercises, 1) if ex.step == step_name]
        items = [f"    - Exercise {n}: [{ex.title}]({link_from(page_src_uri, page_uri(ex))})" for n, ex in chosen]
        return '!!! example "Practise this step"\n\n' + ("\n".join(items) or "    No exercise teaches this step yet.")
    return exercise_table(page_src_uri, list(enumerate(exercises, 1)))


def oom_message_section(src_uri: str, exercise_id: str, reports: Reports) -> str:
    """A hand-written page's marker: one exercise's recorded error, whole, and each of its clauses explained."""
    ex = next((ex for ex in reports.exercises if ex.id == exercise_id), None)
    if ex is None:
        raise PluginError(f"course/{src_uri}: oomlab:oom-message names {exercise_id!r}, which is not an exercise.")
    buggy = (reports.measured(ex.id) or {}).get("buggy") or {}
    if not buggy.get("message"):
        return f"*(The error of [{ex.title}]({link_from(src_uri, page_uri(ex))}) is not measured yet: `oomlab dev verify` on a GPU.)*"
    links = {
        "sizes": link_from(src_uri, "allocator.md") + "#sizes-pools-and-segments",
        "fraction": link_from(src_uri, "allocator.md") + "#memory-fraction",
        "expandable": link_from(src_uri, "allocator.md") + "#allocator-settings",
    }
    md = [
        f"The shipped script of [{ex.title}]({link_from(src_uri, page_uri(ex))}), run under its budget on "
        f"{measured_on(reports.verify)}, ended with:",
        "",
        *recorded_error(buggy, reports),
        "Clause by clause:",
        "",
        *annotated(buggy["message"], links),  # the other processes' lines match no clause
    ]
    return "\n".join(md)
