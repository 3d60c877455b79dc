"""Finding the course folder and its exercises."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.course.manifest import Exercise, load_exercise


def find_root(start: Path | None = None) -> Path:
    """The course folder: $OOMLAB_ROOT, else the nearest folder upwards holding ``exercises/``."""
    if env := os.environ.get("OOMLAB_ROOT"):
        root = Path(env).expanduser().resolve()
        if not (root / "exercises").is_dir():
            raise OomLabError(f"OOMLAB_ROOT={env} has no exercises/ folder.", "Point it at the course folder.")
        return root
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "exercises").is_dir() and (folder / "solutions").is_dir():
            return folder
    raise OomLabError(
        f"No OOM Lab course folder at or above {here}.",
        "Run oomlab from inside the course folder (the one with exercises/ and solutions/).",
    )


class Course:
    """The exercises of one course folder, in teaching order."""

    def __init__(self, root: Path | None = None):
        self.root = root or find_root()
        folders = sorted(p for p in (self.root / "exercises").iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
        self.exercises: list[Exercise] = sorted(
            (load_exercise(p / "exercise.toml", self.root) for p in folders), key=lambda e: (e.order, e.id)
        )

    @property
    def state_dir(self) -> Path:
        return self.root / ".oomlab"

    def get(self, key: str) -> Exercise:
        """An exercise by id, or by its number in ``oomlab list``."""
        by_id = {e.id: e for e in self.exercises}
        if key in by_id:
            return by_id[key]
        if key.isdigit() and 1 <= int(key) <= len(self.exercises):
            return self.exercises[int(key) - 1]
        close = difflib.get_close_matches(key, by_id, n=1)
        suggestion = f"Did you mean {close[0]!r}? " if close else ""
        raise OomLabError(
            f"There is no exercise {key!r}.",
            f"{suggestion}`oomlab list` shows them all: {', '.join(by_id)}.",
        )
