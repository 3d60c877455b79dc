"""The learner's progress: which exercises passed, and how many hints were shown."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from oomlab.course.state import StateDir, read_error, shown, write_atomic
from oomlab.errors import OomLabError


class Progress:
    """``.oomlab/state.json``: which exercises passed, and how many hints were shown.

    A damaged file is never lost: it is moved aside, progress starts afresh, and
    :attr:`recovered` names where the damaged copy was kept, so that the CLI can say so (once:
    the next command finds no damaged file).
    """

    def __init__(self, state: StateDir):
        self.path = state.progress_file
        self.data = {"passed": {}, "hints": {}}
        self.recovered: Path | None = None  # where a damaged state file was moved to, this time
        if not self.path.is_file():
            return
        try:
            raw = self.path.read_bytes()
        except OSError as err:
            raise read_error(self.path, err, "the progress file") from None
        try:
            loaded = json.loads(raw.decode("utf-8"))
            if not isinstance(loaded, dict) or not all(isinstance(loaded.get(k, {}), dict) for k in self.data):
                raise ValueError("not the shape of a state file")
            self.data.update({k: loaded.get(k, {}) for k in self.data})
        except ValueError:  # bad JSON, bad bytes (UnicodeDecodeError), or the wrong shape
            self.recovered = self._move_aside()

    def _move_aside(self) -> Path:
        """Keep the damaged file beside it under a new name; it costs the progress record, never the learner's code."""
        backup = self.path.with_name(f"state.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json")
        try:
            os.replace(self.path, backup)
        except OSError as err:
            raise OomLabError(
                f"The progress file {shown(self.path)} is damaged, and it could not be moved aside to "
                f"{shown(backup.name)}: {err.strerror or err}.",
                f"Make {shown(self.path.parent)} writable, or move the file away yourself; then try again.",
            ) from None
        return backup

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True))

    def passed(self, ex_id: str) -> bool:
        return ex_id in self.data["passed"]

    def mark_passed(self, ex_id: str) -> None:
        self.data["passed"][ex_id] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.save()

    def hints_shown(self, ex_id: str) -> int:
        """How many of ``ex_id``'s hints were shown so far."""
        shown_so_far = self.data["hints"].get(ex_id, 0)
        return shown_so_far if isinstance(shown_so_far, int) and shown_so_far >= 0 else 0

    def next_hint(self, ex_id: str, total: int) -> int:
        """Index of the hint to show now; each call moves one further, stopping at the last."""
        count = self.hints_shown(ex_id)
        self.data["hints"][ex_id] = min(count + 1, total)
        self.save()
        return min(count, total - 1)
