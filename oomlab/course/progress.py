"""The learner's progress and the pristine copies of the exercises, under ``.oomlab/``.

Nothing here ever overwrites a learner's file without first keeping a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.course.manifest import Exercise


def write_atomic(path: Path, text: str) -> None:
    """Write so that a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


class Progress:
    """``.oomlab/state.json``: which exercises passed, and how many hints were shown."""

    def __init__(self, state_dir: Path):
        self.dir = state_dir
        self.path = state_dir / "state.json"
        self.data = {"passed": {}, "hints": {}}
        if self.path.is_file():
            try:
                loaded = json.loads(self.path.read_text(encoding="utf-8"))
                if not isinstance(loaded, dict) or not all(isinstance(loaded.get(k, {}), dict) for k in self.data):
                    raise ValueError("not the shape of a state file")
                self.data.update({k: loaded.get(k, {}) for k in self.data})
            except ValueError:
                # A damaged state file costs the progress record, never the learner's code.
                backup = self.path.with_suffix(f".damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json")
                shutil.move(self.path, backup)

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True))

    def passed(self, ex_id: str) -> bool:
        return ex_id in self.data["passed"]

    def mark_passed(self, ex_id: str) -> None:
        self.data["passed"][ex_id] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.save()

    def next_hint(self, ex_id: str, total: int) -> int:
        """Index of the hint to show now; each call moves one further, stopping at the last."""
        shown = self.data["hints"].get(ex_id, 0)
        self.data["hints"][ex_id] = min(shown + 1, total)
        self.save()
        return min(shown, total - 1)


def pristine_path(ex: Exercise) -> Path:
    return ex.root / ".oomlab" / "originals" / ex.id / ex.file


def _from_git(ex: Exercise) -> str | None:
    """The exercise at git's HEAD when the course is a checkout, else None."""
    rel = ex.learner_path.relative_to(ex.root).as_posix()
    try:
        return subprocess.run(
            ["git", "show", f"HEAD:./{rel}"], cwd=ex.root, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def pristine_source(ex: Exercise) -> str:
    """The exercise as shipped.

    In a git checkout that is the file at HEAD, so a course update is picked up
    (and work the learner commits becomes their new starting point). Elsewhere it
    is the copy kept at first sight under ``.oomlab/originals/``.
    """
    if (source := _from_git(ex)) is not None:
        return source
    path = pristine_path(ex)
    if not path.is_file():
        if not ex.learner_path.is_file():
            raise OomLabError(
                f"{ex.learner_path} is missing and no original copy was kept.", "Restore it from the course repository."
            )
        write_atomic(path, ex.learner_path.read_text(encoding="utf-8"))
    return path.read_text(encoding="utf-8")


def keep_originals(exercises) -> None:
    """Keep each exercise's original at first sight, before the learner can edit it.

    Without git, the learner's file is the only copy of the original: kept only
    at the first reset, an edit made before it would be kept as the "original".
    """
    for ex in exercises:
        if ex.learner_path.is_file() and not pristine_path(ex).is_file():
            try:
                pristine_source(ex)
            except OSError:  # a read-only course folder: reset will say what it cannot do
                pass


def reset(ex: Exercise) -> Path | None:
    """Put the original back; return where the learner's version was kept, if there was one."""
    source = pristine_source(ex)
    backup = None
    if ex.learner_path.is_file():
        current = ex.learner_path.read_text(encoding="utf-8")
        if current == source:
            return None
        folder = ex.root / ".oomlab" / "backups" / ex.id
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = folder / f"{stamp}-{ex.file}"
        n = 1
        while backup.exists():  # two resets within a second keep both versions
            n += 1
            backup = folder / f"{stamp}-{n}-{ex.file}"
        write_atomic(backup, current)
    ex.learner_path.parent.mkdir(parents=True, exist_ok=True)
    ex.learner_path.write_text(source, encoding="utf-8")
    return backup
