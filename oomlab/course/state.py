"""Everything oomlab writes into a course folder, under ``.oomlab/``: each place named once.

The learner's own files (``exercises/``) are never written here except by
``oomlab reset``, which keeps a backup first. What lives under ``.oomlab/``:

==========================  ====================================================
``state.json``              progress: which exercises passed, hints shown
``originals/ID/FILE``       each exercise as shipped, for ``reset``
``backups/ID/``             the learner's versions that ``reset`` replaced
``reference/``              the reference fix's measurement, per GPU and torch
``variants/ID/NAME/FILE``   scripts the truth check measures (bug, wrong fixes, cheats)
``runs/LABEL-TOOL/``        what ``snapshot``, ``hunt``, ``profile`` wrote
``figures/ID/VARIANT/``     the runs behind the site's pictures
``last-error.txt``          the traceback of an internal error, to report
==========================  ====================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NAME", "StateDir", "write_atomic"]

NAME = ".oomlab"


def write_atomic(path: Path, text: str) -> None:
    """Write so that a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


@dataclass(frozen=True)
class StateDir:
    """The ``.oomlab/`` folder of the course at ``root``."""

    root: Path

    @property
    def path(self) -> Path:
        return self.root / NAME

    @property
    def progress_file(self) -> Path:
        return self.path / "state.json"

    @property
    def last_error(self) -> Path:
        return self.path / "last-error.txt"

    @property
    def references(self) -> Path:
        return self.path / "reference"

    def original(self, ex_id: str, file: str) -> Path:
        return self.path / "originals" / ex_id / file

    def backups(self, ex_id: str) -> Path:
        return self.path / "backups" / ex_id

    def variant(self, ex_id: str, name: str, file: str) -> Path:
        return self.path / "variants" / ex_id / name / file

    def run(self, label: str) -> Path:
        return self.path / "runs" / label

    def figure_run(self, ex_id: str, variant: str) -> Path:
        return self.path / "figures" / ex_id / variant
