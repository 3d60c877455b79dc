"""What the maintainers' recipes rely on: everything that names the workflow's tools reads the registry, and the
README's map names every part of the package.

``oomlab/steps.py`` is the registry of the tools. The warm servers' imports, the bench's timings and the
measurements page's columns are made from it: a tool they missed would be imported afresh in every
forked run, timed nowhere and shown nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oomlab.bench import TOOLS
from oomlab.measure.child import PRELOAD
from oomlab.steps import STEPS

REPO = Path(__file__).resolve().parents[1]


def test_every_list_of_tools_names_every_tool_of_the_registry():
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")  # the site's pages
    from oomlab.bench import SPEED_COLUMNS

    names = [s.name for s in STEPS]
    assert all(s.probe in PRELOAD for s in STEPS), "the measuring child imports every tool's probe before the script"
    assert [t for t in TOOLS if t != "diagnose"] == names, f"bench TOOLS is {TOOLS}: it times each step, then diagnose"
    columns = [key.removesuffix("_s") for key, _ in SPEED_COLUMNS]
    assert all(name in columns for name in names), f"SPEED_COLUMNS in bench/__init__.py shows {columns}: not every step"
    for name in names:
        assert (REPO / "oomlab" / "tools" / name / "probe.py").is_file(), f"step {name} has no oomlab/tools/{name}/probe.py"


def test_the_readmes_map_names_every_package_and_module_of_oomlab():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"The map \(.*?```text\n(.*?)```", readme, re.S)
    assert block, "README.md has no map for maintainers"
    mapped = block[1]
    package = REPO / "oomlab"
    parts = [p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    modules = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    missing = [f"oomlab/{name}/" for name in parts if f"oomlab/{name}/" not in mapped and f"oomlab/{name}/NAME" not in mapped]
    missing += [f"{name}.py" for name in modules if f"{name}.py" not in mapped]
    assert not missing, f"README.md's map for maintainers does not name: {', '.join(missing)}"
