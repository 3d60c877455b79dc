"""README.md's figures are written from the manifests and facts.json, and the committed README is current."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from oomlab.course import Course, reports
from oomlab.site import facts as site_facts
from oomlab.site import readme

REPO = Path(__file__).resolve().parents[1]


def test_the_committed_readme_states_the_figures_the_manifests_give():
    course = Course(REPO, working_tree=True)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.BLOCK.search(text), "README.md has no written block: the GPU it needs would be typed by hand"
    current = readme.render(text, course, site_facts.load(REPO / reports.FACTS))
    assert current == text, f"README.md's figures are stale: run `{readme.COMMAND}` and commit README.md."


def test_a_new_budget_changes_what_the_readme_says():
    course = Course(REPO, working_tree=True)
    block = "<!-- written by `oomlab dev readme`: gpu-needs -->\nSTALE\n<!-- end gpu-needs -->"
    before = readme.render(block, course, None)
    largest = max(course.exercises, key=lambda ex: ex.budget_bytes)
    course.exercises[course.exercises.index(largest)] = dataclasses.replace(largest, budget_bytes=largest.budget_bytes * 2)
    after = readme.render(block, course, None)
    assert "STALE" not in before and before != after
    assert f"{largest.budget_bytes * 2 / (1 << 30):.2f} GiB" in after and largest.id in after


def test_a_block_nobody_writes_is_an_error():
    with pytest.raises(KeyError, match="does not write"):
        readme.render("<!-- written by `oomlab dev readme`: typo -->\nx\n<!-- end typo -->", Course(REPO), None)
