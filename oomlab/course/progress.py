"""The learner's progress: which exercises passed, and how many hints were shown."""

from __future__ import annotations

import json
import os
import shutil
import time

from oomlab.course.state import StateDir, write_atomic


class Progress:
    """``.oomlab/state.json``: which exercises passed, and how many hints were shown."""

    def __init__(self, state: StateDir):
        self.path = state.progress_file
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
