"""The reports a build of the site reads, loaded once, and what every page asks of them.

No figure on the site is typed by hand: each comes from a JSON report that a command wrote on a
GPU and that is committed under ``course/`` (the docs folder):

- ``measurements/verify.json``: every run of every exercise, from ``oomlab dev verify``;
- ``figures/figures.json``: the pictures and findings of the tools, from ``oomlab dev figures``
  (:mod:`oomlab.site.figures` writes it);
- ``measurements/facts.json``: what the probe scripts in ``probes/`` measured, from
  ``oomlab dev facts`` (:mod:`oomlab.site.facts`);
- ``measurements/speed.json``: how long a learner waits, from ``oomlab dev bench``;
- ``measurements/equivalence.json``: forked runs against fresh ones, from ``oomlab dev equivalence``;
- ``figures/viewer-shots.json``: PyTorch's memory viewer on the snapshots, from ``oomlab dev viewer-shots``
  (:mod:`oomlab.site.viewer_shots`; no GPU, but two inputs the course does not ship).

:func:`load` reads them all, with the exercises they describe, into one :class:`Reports` when
the build starts (``on_config`` in :mod:`oomlab.site.hooks`); every page is then made from that
one value, passed to it, so no page reads a file of its own or sees another build's reports.
A report that was never written is ``None`` and the pages that quote it say which command writes
it; one that is there but unreadable fails the build, since a page would otherwise quietly lose
its figures.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from mkdocs.exceptions import PluginError

from oomlab.course import reports as committed
from oomlab.course.manifest import Exercise
from oomlab.errors import OomLabError
from oomlab.site import facts as site_facts

__all__ = [
    "EQUIVALENCE_JSON",
    "FACTS_JSON",
    "FIGURES_JSON",
    "PROBES",
    "SPEED_JSON",
    "VERIFY_JSON",
    "VIEWER_SHOTS_JSON",
    "Reports",
    "derived_facts",
    "drawn_on",
    "load",
    "load_verify",
    "measured_date",
    "measured_on",
]

log = logging.getLogger("mkdocs.hooks.oomlab")

# Where each report lives is oomlab.course.reports' to say; the pages read and link them relative to docs_dir.
VERIFY_JSON = committed.on_site(committed.VERIFY)
FIGURES_JSON = committed.on_site(committed.FIGURES)
FACTS_JSON = committed.on_site(committed.FACTS)
SPEED_JSON = committed.on_site(committed.SPEED)
EQUIVALENCE_JSON = committed.on_site(committed.EQUIVALENCE)
VIEWER_SHOTS_JSON = committed.on_site(committed.VIEWER_SHOTS)
PROBES = committed.on_site(site_facts.PROBES_DIR)  # the probe scripts behind facts.json


@dataclass(frozen=True)
class Reports:
    """Everything one build reads: the exercises in course order and the committed reports about them."""

    exercises: list[Exercise]  # the manifests as edited in the working tree: a page shows a change before it is committed
    verify: dict | None = None  # verify.json, None before `oomlab dev verify` ran
    verify_problem: str = ""  # why there is no verify.json, said where its figures would be
    figures: dict = field(default_factory=dict)  # figures.json, empty before `oomlab dev figures` ran
    facts: dict | None = None  # facts.json, None before `oomlab dev facts` ran
    probes: dict = field(default_factory=dict)  # the probe scripts by name, which facts.json must match
    derived: dict = field(default_factory=dict)  # figures that follow from the manifests and facts.json (`course.*`)
    speed: dict | None = None  # speed.json, None before `oomlab dev bench` ran
    equivalence: dict | None = None  # equivalence.json, None before `oomlab dev equivalence` ran
    viewer_shots: dict = field(default_factory=dict)  # viewer-shots.json, empty before `oomlab dev viewer-shots` ran

    def viewer_shot(self, snapshot: str) -> dict | None:
        """The record of PyTorch's viewer drawn on ``snapshot`` (a pickle's file name), or None where it was not."""
        return next((s for s in self.viewer_shots.get("shots", []) if s.get("snapshot") == snapshot), None)

    def measured(self, ex_id: str) -> dict | None:
        """The exercise's row of verify.json, or None when it has none (or there is no verify.json)."""
        if not self.verify:
            return None
        return next((row for row in self.verify["exercises"] if row.get("id") == ex_id), None)


def load(root: Path, docs_dir: Path) -> Reports:
    """The course under ``root`` and the reports under ``docs_dir``, or a PluginError saying which is unreadable and why."""
    from oomlab.course import Course
    from oomlab.grading.truth import validate_exercise

    try:
        exercises = Course(root, working_tree=True).exercises  # the pages show the manifests as edited
        for ex in exercises:
            validate_exercise(ex)  # the pages describe each check (or part) the manifest names
    except OomLabError as err:
        raise PluginError(str(err)) from None
    verify, verify_problem = load_verify(docs_dir)
    try:
        facts = site_facts.load(docs_dir / FACTS_JSON)
        probes = {p.name: p for p in site_facts.find_probes(docs_dir / PROBES)}
    except ValueError as err:
        raise PluginError(f"course/{FACTS_JSON} is not a facts report: {err}") from None
    except OomLabError as err:
        raise PluginError(str(err)) from None
    if facts is None:
        log.info(f"There is no {FACTS_JSON} yet: on a CUDA GPU, `{site_facts.COMMAND}` writes it.")
    speed, equivalence, viewer_shots = (_load_json(docs_dir, name) for name in (SPEED_JSON, EQUIVALENCE_JSON, VIEWER_SHOTS_JSON))
    figures_path = docs_dir / FIGURES_JSON
    figures = json.loads(figures_path.read_text(encoding="utf-8")) if figures_path.is_file() else {}
    if verify_problem:
        log.info(verify_problem)
    return Reports(
        exercises=exercises,
        verify=verify,
        verify_problem=verify_problem,
        figures=figures,
        facts=facts,
        probes=probes,
        derived=derived_facts(exercises, facts),
        speed=speed,
        equivalence=equivalence,
        viewer_shots=viewer_shots or {},
    )


def _load_json(docs_dir: Path, name: str) -> dict | None:
    path = docs_dir / name
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except ValueError as err:
        raise PluginError(f"course/{name} is not valid JSON: {err}") from None


def load_verify(docs_dir: Path) -> tuple[dict | None, str]:
    """verify.json, or None and what writes it; a PluginError when it is there but is not a report."""
    path = docs_dir / VERIFY_JSON
    if not path.is_file():
        return None, f"There is no {path.name} yet: on a CUDA GPU, `make verify` (`oomlab dev verify`) writes it."
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise PluginError(f"course/{VERIFY_JSON} is not valid JSON: {err}") from None
    if not isinstance(report, dict) or not isinstance(report.get("exercises"), list):
        raise PluginError(f"course/{VERIFY_JSON} has no 'exercises' list; write it with `oomlab dev verify`.")
    return report, ""


def derived_facts(exercises: list[Exercise], report: dict | None) -> dict:
    """Figures that follow from the manifests and facts.json (``course.*`` in a fact marker), and the tools' settings (``tools.*``)."""
    from oomlab.measure.ranks import ENDED_GRACE_S, GRACE_S
    from oomlab.tools.ranks.analysis import SPREAD_FLOOR, SPREAD_SHARE

    largest = max((ex.budget_bytes for ex in exercises), default=0)
    context = None
    if report is not None and isinstance(report["facts"].get("cuda_context"), dict):
        context = report["facts"]["cuda_context"].get("non_pytorch_bytes")
    return {
        "course": {
            "largest_budget_bytes": largest,
            # the largest budget plus what a capped process holds outside the allocator
            "need_bytes": site_facts.NOT_MEASURED if context is None else largest + context,
        },
        "tools": {
            "ranks_grace_s": GRACE_S,
            "ranks_ended_grace_s": ENDED_GRACE_S,
            "ranks_spread_floor_bytes": SPREAD_FLOOR,
            "ranks_spread_share_fraction": SPREAD_SHARE,
        },
    }


def measured_on(report: dict) -> str:
    """The machine a report was measured on: ``NVIDIA H200, torch 2.11.0``."""
    return f"{report.get('gpu') or 'unknown GPU'}, torch {report.get('torch') or '?'}"


def measured_date(report: dict) -> str:
    """When a report was written, as its ``created`` says, in minutes."""
    created = report.get("created") or ""
    try:
        return datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M %Z").strip()
    except ValueError:
        return created or "unknown date"


def drawn_on(index: dict) -> str:
    """Where and when ``oomlab dev figures`` drew ``figures.json``: ``NVIDIA H200, torch 2.11.0, 2026-12-02``."""
    return f"{index.get('gpu', '?')}, torch {index.get('torch', '?')}, {str(index.get('created', '?'))[:10]}"
