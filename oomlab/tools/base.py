"""What every tool shares: the probe's life cycle, its result file, and the pictures' set-up.

A tool is a package ``oomlab/tools/<name>/`` with three modules:

- ``probe.py``: a :class:`Probe` subclass that runs inside the measuring
  process around the learner's script. It imports only the standard library,
  the torch it is handed, and oomlab's standard-library-only modules
  (:mod:`oomlab.oom`, :mod:`oomlab.frames`, :mod:`oomlab.units`, this one and the
  tool's own ``analysis``), so the script sees a process close to ``python train.py``;
- ``analysis.py``: pure functions over plain data, which the tests drive with
  synthetic input and no GPU;
- ``present.py``: ``render(result)`` (rich renderables for the terminal) and
  ``draw(result, out_dir)`` (PNG pictures), run by the parent on the JSON.

The probe writes ``<name>.json`` into its output folder whatever happens: a
failure inside it becomes the result's ``error``, never the learner's error.
Its ``timing`` says where a tool's time went: the script under the probe
(``script_s``) and the analysis after it (``analysis_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

from oomlab.oom import first_line

__all__ = ["Probe", "error_result", "pyplot", "run_summary", "save_figure", "write_result"]


def error_result(tool: str, message: str, **extra) -> dict:
    """A result that says the tool found nothing because it failed, and why."""
    return {"tool": tool, "kind": "error", "headline": f"{tool} failed: {message}", "culprit_bytes": 0, "error": message, **extra}


def run_summary(m) -> dict:
    """How the run under a probe ended (a :class:`oomlab.measure.harness.Measurement`), as its result keeps it: ``run``."""
    return {
        "status": m.status,
        "where": m.where,
        "message": first_line(m.message),
        "wall_s": m.wall_s,
        "peak_allocated": (m.stats or {}).get("peak_allocated"),
    }


def write_result(out_dir: Path, tool: str, result: dict) -> Path | None:
    """Write ``out_dir/<tool>.json`` atomically; on failure say so on stderr and return None (never raise)."""
    try:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{tool}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
        tmp.replace(path)
        return path
    except Exception as err:  # noqa: BLE001 - nowhere left to report it but stderr
        print(f"[oomlab] the {tool} tool could not write its result: {err}", file=sys.stderr)
        return None


class Probe:
    """One tool's work inside the measured process: :meth:`start` before the script, :meth:`finish` after.

    Subclasses set :attr:`tool` and override :meth:`on_start`, :meth:`analyse`
    and, when they leave hooks behind, :meth:`close`. Neither :meth:`start` nor
    :meth:`finish` ever raises: the learner's run must not fail because of us.
    """

    tool = ""
    started: float | None = None  # perf_counter() when the script began, once start() ran

    def __init__(self, torch, out_dir: Path, options: dict | None = None):
        self.torch = torch
        self.out_dir = Path(out_dir)
        self.options = dict(options or {})
        self.error = ""  # set when starting failed; finish() then reports it
        self.script = os.path.abspath(self.options["script"]) if self.options.get("script") else ""

    def start(self) -> None:
        try:
            self.on_start()
        except Exception as err:  # noqa: BLE001
            self.error = f"could not start: {type(err).__name__}: {err}"
        self.started = time.perf_counter()

    def finish(self, exc: BaseException | None, script_globals: dict | None) -> dict:
        """Analyse what the run left (inside the ``except`` block when it raised) and write the result."""
        ended = time.perf_counter()
        try:
            if self.error:
                result = error_result(self.tool, self.error)
            else:
                result = self.analyse(exc, script_globals)
        except BaseException as err:  # noqa: BLE001 - whatever happens, the JSON says it
            result = error_result(self.tool, f"{type(err).__name__}: {err}", error_traceback=traceback.format_exc()[-3000:])
        finally:
            with contextlib.suppress(Exception):  # nothing of ours runs after this in the process
                self.close()
        result["timing"] = {
            "script_s": None if self.started is None else round(ended - self.started, 3),
            "analysis_s": round(time.perf_counter() - ended, 3),
        }
        write_result(self.out_dir, self.tool, result)
        return result

    def on_start(self) -> None:
        """Install what records the run (history, hooks, a profiler)."""

    def analyse(self, exc: BaseException | None, script_globals: dict | None) -> dict:
        """The result: at least ``tool``, ``kind``, ``headline`` and ``culprit_bytes``."""
        raise NotImplementedError

    def close(self) -> None:
        """Remove whatever :meth:`on_start` installed."""


# The pictures end up in a page's column, about 690 CSS pixels wide, as much as in a file. Drawn 8 inches wide at
# 150 dpi they are 1,200 pixels, and a 9-point label is 19 of them: about 11 pixels in the column, where the
# 12-inch, 100-dpi pictures before gave 7 (the site also opens each at full size).
FIGURE_WIDTH_IN, FIGURE_DPI = 8, 150


def figure(plt, height_in: float, *grid, **kwargs):
    """A figure of the pictures' common width and resolution, ``height_in`` inches high: ``plt.subplots``'s (fig, axes)."""
    return plt.subplots(*grid, figsize=(FIGURE_WIDTH_IN, height_in), dpi=FIGURE_DPI, **kwargs)


def pyplot():
    """matplotlib's pyplot on the Agg backend: pictures are files, drawn with no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Save and close ``fig``; the folder is made if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
