"""The committed reports: machine-written files under ``course/`` that the site, the tests and the tools read.

Each is written by one maintainer command on a GPU (``oomlab dev …``) and never
typed; the paths are relative to the course root, and :data:`DOCS` is the site's
``docs_dir``, so the site reads the same file as ``DOCS / ...`` relative paths.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DOCS", "EQUIVALENCE", "FACTS", "FIGURES", "FIGURES_DIR", "SPEED", "VERIFY", "VIEWER_SHOTS", "on_site"]

DOCS = Path("course")  # mkdocs' docs_dir
VERIFY = DOCS / "measurements" / "verify.json"  # `oomlab dev verify`: every run of the truth check
EQUIVALENCE = DOCS / "measurements" / "equivalence.json"  # `oomlab dev equivalence`: fresh against forked runs
SPEED = DOCS / "measurements" / "speed.json"  # `oomlab dev bench`: what a learner waits for
FACTS = DOCS / "measurements" / "facts.json"  # `oomlab dev facts`: the probes the pages quote
FIGURES_DIR = DOCS / "figures"  # `oomlab dev figures`: the pictures, and figures.json, their index
FIGURES = FIGURES_DIR / "figures.json"
VIEWER_SHOTS = FIGURES_DIR / "viewer-shots.json"  # `oomlab dev viewer-shots`: PyTorch's viewer on the snapshots


def on_site(report: Path) -> str:
    """The report's path as the site links it: relative to ``docs_dir``."""
    return report.relative_to(DOCS).as_posix()
