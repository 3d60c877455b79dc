"""The profile tool inside the measured process: profile the script, then find and explain its memory peak.

:meth:`Probe.on_start` enters ``torch.profiler.profile`` (CPU always, CUDA
when available; memory, shapes and Python stacks recorded) before the script
runs. :meth:`Probe.analyse` runs when the script is over, inside the ``except``
block if it raised: it stops the profiler, reads what it recorded
(:mod:`~oomlab.tools.profile.events`), names every allocation's category
(:mod:`~oomlab.tools.profile.categories`) and finds the peak, its line and its
kind (:mod:`~oomlab.tools.profile.analysis`).

Options (all optional): ``script``; ``budget_bytes``, drawn on the chart and
compared with the failed request; ``device``, the device whose memory to
follow (by default the GPU the run allocated on, else the CPU); and
``max_steps``, which stops the profiler after that many optimizer steps, so
the trace (and the time to analyse it) stays bounded on long runs.

Why bound it: torch's memory model (``_memory_profiler.MemoryProfile``) walks
every recorded event in Python, and its cost grows faster than the number of
steps: on all 840 small steps of a 12-epoch script it took 181 s (70 steps:
6.3 s; measured on a 2-core CPU machine). The steps of a training loop
repeat, so the first few show the peak of every one of them; a run that fails
after the profiled steps says so, with the line it failed at.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

from oomlab.frames import failed_at
from oomlab.oom import first_line, is_oom, parse_message
from oomlab.tools import base
from oomlab.tools.profile import analysis, events
from oomlab.tools.profile.analysis import CATEGORIES, MAX_POINTS, TOOL
from oomlab.tools.profile.categories import categorize

__all__ = ["Probe"]


class Probe(base.Probe):
    """Profile the script; at the end, stop the profiler and turn what it recorded into ``profile.json``."""

    tool = TOOL
    prof = None  # the profiler, once it runs
    hook = None  # the optimizer step hook that stops it after max_steps and counts the steps after, while installed
    steps = 0  # optimizer steps counted by that hook, profiled or not
    profiled_steps = 0  # of which the profiler saw
    stopped = False  # the profiler has been stopped (by the hook, or at the end)
    kept_code: list | None = None  # the code exec() ran while profiling, alive until the events are parsed

    def on_start(self) -> None:
        from torch.profiler import ProfilerActivity, profile  # a submodule: imported, not reached as an attribute

        # The profiler reads the name of a Python call from its code object only when the events are parsed, after
        # the script ended; by then the module code that exec() ran (the script's, through runpy, and that of every
        # module imported while profiling, such as torch._dynamo at AdamW's first step) has been dropped, and the name
        # could come back as freed memory (a UnicodeDecodeError that lost the operator table, about one CPU run in
        # ten). An audit hook, which sees every exec(), keeps that code alive until the probe is done.
        self.kept_code = []
        sys.addaudithook(self._keep_executed_code)

        activities = [ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True)
        max_steps = self.options.get("max_steps")
        if max_steps:
            # Recent torch.optim deletes its ``optimizer`` attribute: the submodule is reached by import only.
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: self._count_step(int(max_steps)))
        with _quiet():
            prof.__enter__()
        self.prof = prof  # only now: the hook and close() stop a profiler that runs, never one that failed to start

    def analyse(self, exc: BaseException | None, script_globals: dict | None) -> dict:
        """Stop the profiler (also after an OOM) and explain what it recorded.

        Besides the findings, ``stopped_early`` says whether ``max_steps``
        stopped the profiler before the script ended, and ``unprofiled_failure``
        where a run failed after that.
        """
        if self.prof is None:
            raise RuntimeError("the profiler never ran: start() was not called")
        stopped_early = self.stopped
        self._stop()
        with _quiet():
            # A failure after the profiled steps is not in the trace: the steps in it all ended.
            result = self._result(None if stopped_early else exc)
        result["stopped_early"] = stopped_early
        if stopped_early and exc is not None:
            result["oom"] = is_oom(exc)
            result["failed_at"] = _failed_at(exc, self.script)
            result["unprofiled_failure"] = {"after_steps": self.steps, "message": first_line(str(exc))}
        result["headline"] = analysis.headline(result)  # now that it knows which steps it saw
        result["advice"] = analysis.advice(result)
        return result

    def _keep_executed_code(self, event: str, args: tuple) -> None:
        if event == "exec" and self.kept_code is not None and args:
            self.kept_code.append(args[0])

    def close(self) -> None:
        self.kept_code = None  # an audit hook cannot be removed: it stops keeping anything
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        self._stop()

    def _count_step(self, max_steps: int) -> None:
        self.steps += 1
        if self.stopped or self.steps < max_steps:
            return
        try:
            self._stop()
        except Exception as err:  # noqa: BLE001 - this runs inside the learner's optimizer.step()
            self.error = f"the profiler could not stop after {max_steps} optimizer steps: {type(err).__name__}: {err}"

    def _stop(self) -> None:
        """Stop the profiler, once; later steps run unprofiled (the step hook only counts them)."""
        if self.prof is not None and not self.stopped:
            self.profiled_steps = self.steps
            self.stopped = True
            with _quiet():
                self.prof.__exit__(None, None, None)

    def _result(self, exc: BaseException | None) -> dict:
        """The stopped profiler as the JSON result: top operators, the timeline by category, the peak and its kind."""
        torch, options, script = self.torch, self.options, self.script
        failed = exc is not None
        result: dict = {
            "tool": TOOL,
            "kind": "unknown",
            "headline": "",
            "culprit_bytes": 0,
            "torch": str(torch.__version__),
            "script": script,
            "profiled_steps": self.profiled_steps if options.get("max_steps") else None,
            "max_steps": options.get("max_steps"),
            "failed": failed,
            "oom": is_oom(exc),
            "failed_at": _failed_at(exc, script) if failed else None,
        }
        if options.get("budget_bytes"):
            result["budget_bytes"] = int(options["budget_bytes"])
        notes: list[str] = []

        tree = None
        try:
            tree = self.prof.profiler.kineto_results.experimental_event_tree()
        except Exception as err:
            notes.append(f"the profiler's event tree is unavailable ({type(err).__name__}: {err}): no timeline, no peak")
        recorded = list(events.walk(tree)) if tree is not None else []
        allocations = events.allocation_events(recorded)
        device = options.get("device") or events.profiled_device(allocations)
        result["device"] = device
        result["top_ops"], result["top_ops_metric"] = events.top_ops(self.prof, device, notes)

        # The timeline: every allocation and free on the device, each with its tensor's category.
        dev_allocs = [a for a in allocations if a[3] == device]
        step_ends = sorted(e.end_time_ns for e in recorded if events.is_op(e) and e.name.startswith("Optimizer.step#"))
        result["steps_seen"] = len(step_ends)
        sites = events.Sites(recorded, script)
        categories, model = categorize(self.prof, recorded, dev_allocs, step_ends, failed, sites, notes)
        result["memory_model"] = model
        deltas = [(a[0], category, a[1]) for a, category in zip(dev_allocs, categories, strict=True) if category is not None]
        source = "categories" if tree is not None else "none"
        times, levels = analysis.coalesce(deltas)
        if not times:
            result["timeline"] = {"source": source, "times_ms": [], "bytes": {}, "total": [], "step_ends_ms": []}
            result["peak"] = None
            result["notes"] = notes + ["no memory was allocated on the profiled device while profiling"]
            result["headline"] = f"no memory was allocated on {device} while the profiler ran"
            if result["top_ops"]:
                result["headline"] += f"; the largest operator was {result['top_ops'][0]['op']}"
            return result

        # The peak: of the whole run, or of the step that failed (which never ended) when the run failed.
        t0 = times[0]
        totals = analysis.total_levels(levels)
        window_start = step_ends[-1] if failed and step_ends and step_ends[-1] < times[-1] else None
        i = analysis.peak_index(times, totals, after=window_start)
        peak = {
            "time_ms": (times[i] - t0) / 1e6,
            "total_bytes": totals[i],
            "by_category": {c: levels[c][i] for c in CATEGORIES if levels[c][i]},
            "in_failed_step": window_start is not None or (failed and not step_ends),
        }
        after = analysis.level_after(times, totals, step_ends, times[i], failed)
        peak["level_after_step_bytes"] = after
        peak["freed_after_peak_bytes"] = None if after is None else max(0, totals[i] - after)
        earlier = [s for s in step_ends if s < times[i]]
        before = analysis.level_at(times, totals, earlier[-1]) if earlier else None
        site, live = events.peak_site(dev_allocs, times[i], sites)
        peak.update(site)
        carried = None
        if after is None and live:
            # A step that never ended: do tensors from earlier forward passes of it survive (a cache, kept graphs)?
            allocated_at = {index: dev_allocs[index][0] for index in live}
            window = earlier[-1] if earlier else None
            carried = analysis.carried_bytes(events.forward_passes(recorded), live, allocated_at, window, times[i])
        peak["carried_from_earlier_forwards_bytes"] = carried
        kind, basis = analysis.classify(totals[i], after, before, peak["by_category"], model["available"], carried)
        peak["kind_basis"] = basis
        if failed:
            t_fail, live_at_fail = analysis.failure_point(dev_allocs, times, totals)
            result["failure"] = {
                "time_ms": (t_fail - t0) / 1e6,
                "live_bytes": live_at_fail,
                "request_bytes": parse_message(str(exc))["request"],
            }
        run_peak = analysis.peak_index(times, totals)
        result["run_peak"] = {"time_ms": (times[run_peak] - t0) / 1e6, "total_bytes": totals[run_peak]}
        result["peak"] = peak
        result["kind"] = kind
        result["culprit_bytes"] = int((peak.get("culprit") or {}).get("bytes") or 0)
        result["timeline"] = {
            "source": source,
            "points_before_downsampling": len(times),
            **analysis.downsample(times, levels, t0, MAX_POINTS),
            "step_ends_ms": [(t - t0) / 1e6 for t in step_ends][:MAX_POINTS],
        }
        result["notes"] = notes
        result["headline"] = analysis.headline(result)
        return result


def _failed_at(exc: BaseException, script: str) -> dict | None:
    """The learner's line where the exception passed last, as ``{"file", "line", "text"}``."""
    found = failed_at(exc, script) if script else {}
    if not found:
        return None
    return {"file": os.path.basename(script), "line": found["line_no"], "text": found["line"]}


@contextlib.contextmanager
def _quiet():
    """Silence the profiler's own UserWarnings: they are about the probe, not the learner's code."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.(profiler|autograd)")
        yield
