"""Pictures of the probes' results: ``<!-- oomlab:chart NAME -->`` in a page becomes one, drawn from ``facts.json``.

Each chart here names the probe it draws (``course/probes/PROBE.py``) and turns that probe's
results into the rows of a picture from :mod:`oomlab.site.charts`. Before the probe has run,
the marker says so instead; a name not listed here fails the build.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from oomlab.site.charts import stacked_bars, uptime_chart

__all__ = ["CHART_MARKER", "CHARTS", "chart"]

CHART_MARKER = re.compile(r"<!--\s*oomlab:chart\s+([\w-]+)\s*-->")

PHASES = {
    "before_forward": "before forward",
    "after_forward": "after forward",
    "backward_peak": "peak in backward",
    "after_backward": "after backward",
    "optimizer_step_peak": "peak in optimizer.step()",
}
# The parts of a phase, in the order they stack; the rest of each phase has a name of its own.
PARTS = {
    "parameters_bytes": "parameters",
    "optimizer_state_bytes": "AdamW state",
    "gradients_bytes": "gradients",
    "batch_and_workspaces_bytes": "batch, workspaces",
}
REST = {
    "saved_for_backward_bytes": "saved for backward",
    "backward_working_set_bytes": "backward's working set",  # at its peak: the saved tensors still waiting, and backward's temporaries
    "optimizer_temporaries_bytes": "temporaries",
}
REMEDIES = {
    "baseline": "batch of 16",
    "accumulation": "4 micro-batches of 4",
    "checkpointing": "checkpoint each layer",
    "offload": "saved tensors on the CPU",
}


def step_anatomy(result: dict) -> str:
    rows = []
    for key, label in PHASES.items():
        phase = result["anatomy"]["phases"][key]
        parts = [(name, phase.get(k, 0)) for k, name in PARTS.items()]
        rest = {name: 0 for name in dict.fromkeys(REST.values())}
        for k, name in REST.items():
            rest[name] += phase.get(k, 0)
        rows.append((label, parts + list(rest.items())))
    return stacked_bars(rows, "Allocated memory of one training step, phase by phase")


def step_remedies(result: dict) -> str:
    rows = [(label, [("peak allocated", result["remedies"][key]["peak_allocated_bytes"])]) for key, label in REMEDIES.items()]
    return stacked_bars(rows, "Peak allocated memory of the same step under each remedy")


def worker_uptime(result: dict) -> str:
    labels = {"defaults": "default settings", "expandable": "expandable_segments:True"}
    return uptime_chart([(labels.get(variant, variant), r) for variant, r in result.items()])


# name -> (the probe whose results it draws, the drawing)
CHARTS: dict[str, tuple[str, Callable[[dict], str]]] = {
    "step-anatomy": ("training_step", step_anatomy),
    "step-remedies": ("training_step", step_remedies),
    "worker-uptime": ("worker_uptime", worker_uptime),
}


def chart(name: str, facts: dict | None) -> str | None:
    """The SVG of chart ``name`` from a ``facts.json`` report; None before its probe ran. KeyError for an unknown name."""
    probe, draw = CHARTS[name]
    result = ((facts or {}).get("facts") or {}).get(probe)
    return draw(result) if result else None
