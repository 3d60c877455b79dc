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

from graders.errors import OomLabError
from graders.manifest import Exercise


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
                if not isinstance(loaded, dict):
                    raise ValueError("not a JSON object")
                self.data.update({k: loaded.get(k, {}) for k in self.data})
            except ValueError:
                # A damaged state file costs the progress record, never the learner's code.
                backup = self.path.with_suffix(f".damaged-{int(time.time())}.json")
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


def pristine_source(ex: Exercise) -> str:
    """The exercise as shipped: kept at first sight, from git's HEAD when the course is a checkout."""
    path = pristine_path(ex)
    if not path.is_file():
        rel = ex.learner_path.relative_to(ex.root).as_posix()
        try:
            source = subprocess.run(
                ["git", "show", f"HEAD:{rel}"], cwd=ex.root, capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            if not ex.learner_path.is_file():
                raise OomLabError(f"{ex.learner_path} is missing and no original copy was kept.", "Restore it from the course repository.") from None
            source = ex.learner_path.read_text(encoding="utf-8")
        write_atomic(path, source)
    return path.read_text(encoding="utf-8")


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
