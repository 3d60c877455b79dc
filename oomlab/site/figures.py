"""The course site's pictures, drawn by the workflow's own tools from real GPU runs.

``oomlab figures`` runs each exercise's tool (the step it teaches) on its seeded
bug and on the reference fix, and copies the pictures, the findings and any
allocator snapshot (for PyTorch's own viewer) into ``course/figures/``. Nothing in there is drawn or typed by hand.
"""

from __future__ import annotations

import datetime
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable

from oomlab.course.progress import pristine_source
from oomlab.grading.truth import write_variant
from oomlab.tools.run import resolve, run_tool


def regenerate(course, out: Path, note: Callable[[str], None] = lambda _: None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    index = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "figures": {}}
    written = []
    for ex in course.exercises:
        tool = ex.step
        module = __import__(f"oomlab.tools.{tool}", fromlist=["draw"])
        for variant, script in (("bug", write_variant(ex, "original", pristine_source(ex))), ("fix", ex.solution_path)):
            note(f"{tool} on {ex.id} ({variant})…")
            target = replace(resolve([ex.id]), script=script)
            options = {"max_steps": 3} if tool == "profile" else {}  # a few steps show the peak; all of them cost minutes
            m, result = run_tool(target, tool, course.state_dir / "figures" / ex.id / variant, options)
            index.setdefault("gpu", m.gpu)
            index.setdefault("torch", m.torch)
            files = []
            for picture in module.draw(result, Path(result["out_dir"])):
                dest = out / f"{ex.id}-{variant}-{picture.name}"
                shutil.copyfile(picture, dest)
                files.append(dest.name)
                written.append(dest)
            snapshot = Path(result["out_dir"]) / "snapshot.pickle"
            if snapshot.is_file():  # readers can open it in PyTorch's own viewer
                dest = out / f"{ex.id}-{variant}-snapshot.pickle"
                shutil.copyfile(snapshot, dest)
                written.append(dest)
            index["figures"][f"{ex.id}-{variant}"] = {
                "exercise": ex.id,
                "variant": variant,
                "tool": tool,
                "kind": result.get("kind"),
                "headline": result.get("headline"),
                "wall_s": m.wall_s,
                "files": files,
                "snapshot": dest.name if snapshot.is_file() else None,
            }
    (out / "figures.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*written, out / "figures.json"]
