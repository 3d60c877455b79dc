"""Named checks: a measurement against the reference solution and the exercise's thresholds.

Every check says what it measured, what it compared with, whether it passed,
and in one sentence why it matters. Thresholds relative to the reference come
from the reference solution measured on the same GPU and torch version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlab.errors import OomLabError
from oomlab.measure import weights
from oomlab.measure.harness import Measurement
from oomlab.oom import first_line
from oomlab.units import MIB, format_bytes


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    measured: str
    threshold: str
    why: str
    detail: str = ""  # on failure: what differs and what it means


class Check:
    """One kind of check. Subclasses set ``name``, ``why``, ``params`` and ``evaluate``, and say what they are:

    - ``earns_points``: a memory check, whose pass earns the notebook's points; otherwise an honesty check,
      which earns none but without whose pass no memory point counts (the run is no longer the same job,
      measured untouched);
    - ``always``: every exercise runs it, whatever its manifest lists (a manifest may still set its parameters);
    - :meth:`passes_when`: what passing means in words, for the exercise pages, from the same numbers
      :meth:`evaluate` compares with.
    """

    name = ""
    why = ""
    params: dict[str, type] = {}
    earns_points = False
    always = False

    def passes_when(self, params: dict, reference: dict | None = None, where: str = "") -> str:
        """What passing takes, in words, under the manifest's ``params`` (and, where the check compares with the
        reference fix's figures, ``reference``'s, by the course's names, measured on ``where``); empty where ``why``
        says it all."""
        return ""

    def validate(self, given: dict, where: str) -> None:
        for key, value in given.items():
            if key not in self.params:
                allowed = ", ".join(self.params) or "none"
                raise OomLabError(f"{where}: unknown parameter {key!r}.", f"Allowed: {allowed}.")
            kind = self.params[key]
            if not isinstance(value, (int, float) if kind is float else kind) or (isinstance(value, bool) and kind is not bool):
                raise OomLabError(f"{where}: {key} should be a {kind.__name__}, found {value!r}.", "")

    def evaluate(self, m: Measurement, ref: Measurement | None, params: dict) -> CheckResult:
        raise NotImplementedError

    def result(self, passed: bool, measured: str, threshold: str, detail: str = "") -> CheckResult:
        return CheckResult(self.name, passed, measured, threshold, self.why, "" if passed else detail)


def _stat(m: Measurement | None, key: str) -> int | None:
    return None if m is None or m.stats is None else m.stats.get(key)


def close(a: float, b: float, rtol: float, atol: float) -> bool:
    """Whether ``a`` agrees with the reference value ``b``: ``|a - b| <= atol + rtol * |b|``.

    For finite values this is ``numpy.isclose``'s rule, and like it not
    symmetric: the relative part scales with ``b``, so pass the reference
    second. ``atol`` is what lets values near zero agree, where any relative
    tolerance is almost nothing. Unlike numpy, nothing is close to a NaN, and
    two equal infinities are not close either (their difference is NaN).
    """
    return abs(a - b) <= atol + rtol * abs(b)


class NoOom(Check):
    name = "no_oom"
    earns_points = True
    why = "The run has to fit the exercise's memory budget: an out-of-memory error ends a real training job."
    params = {"caught_max": int}  # OOMs the script may catch and recover from, where recovering is the lesson

    def evaluate(self, m, ref, params):
        caught_max = params.get("caught_max", 0)
        ooms = _stat(m, "ooms") or 0
        threshold = "no OOM" if not caught_max else f"no OOM left uncaught, at most {caught_max} caught"
        if m.status == "oom" or ooms > caught_max:
            where = f" at {m.where}" if m.where else ""
            first = first_line(m.message, None) or "CUDA out of memory"
            # The counter also counts OOMs a library caught and recovered from (cuDNN trying a large
            # workspace and falling back to a smaller one), so it cannot say that the script caught them.
            caught = (
                ""
                if m.status == "oom"
                else f" ({ooms} allocation(s) failed and were handled inside the run, by the script or by a library "
                "such as cuDNN falling back to a smaller workspace)"
            )
            return self.result(False, f"OOM{where}", threshold, f"{first}{caught}")
        return self.result(True, f"{ooms} caught OOM(s)" if ooms else "no OOM", threshold)


class Settings(Check):
    name = "settings"
    always = True
    why = "The allocator's settings are part of the exercise: where the fix belongs in the code, a setting that hides the bug is not it."

    def evaluate(self, m, ref, params):
        wanted, free = params.get("alloc_conf", ""), params.get("learner_settings", False)
        used = m.alloc_conf or "the defaults"
        if "backend" in m.alloc_conf or m.allocator_backend not in ("", "native"):
            return self.result(
                False,
                used,
                "the native caching allocator",
                "The course grades the native caching allocator (its statistics and its budget); "
                "another backend is not a fix of this script.",
            )
        if free or m.alloc_conf == wanted:
            return self.result(True, used, "any setting" if free else wanted or "the defaults")
        return self.result(
            False,
            used,
            wanted or "the defaults",
            f"The script sets the allocator's settings to {used!r}; this exercise runs with {wanted or 'the defaults'} "
            "and wants the fix in the code. Allocator settings come last: find the structural fix first.",
        )


class Untampered(Check):
    name = "untampered"
    always = True
    why = "The grader reads the allocator's own statistics; a run that resets them or lifts the budget proves nothing."

    def evaluate(self, m, ref, params):
        problems = list(m.tamper)
        if m.sandbox.get("asked") and "applied" not in m.sandbox:
            problems.append("ended with a result the harness did not write (it lacks the harness's own reports)")
        if m.caching_at_start is False:
            problems.append("ran with the caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING), so it cached nothing")
        peak = _stat(m, "peak_reserved")
        if peak is not None and m.budget_bytes and peak > m.budget_bytes:
            problems.append(f"reserved {format_bytes(peak)}, more than the {format_bytes(m.budget_bytes)} budget")
        if problems:
            return self.result(False, "; ".join(problems), "statistics untouched", "The script " + "; ".join(problems) + ".")
        return self.result(True, "statistics untouched", "statistics untouched")


class RelativeBytes(Check):
    """A peak figure no more than the reference's, times (1 + tolerance), or plus a slack in MiB if that is larger."""

    params = {"tolerance": float, "slack_mib": float}
    earns_points = True

    def __init__(self, stat: str, why: str, advice: str):
        self.name = self.stat = stat  # the check is named after the figure it reads
        self.why = why
        self.advice = advice

    @staticmethod
    def allowance(params: dict) -> tuple[float, int]:
        """The relative and the absolute allowance over the reference: (tolerance, slack in bytes)."""
        return params.get("tolerance", 0.10), round(params.get("slack_mib", 0) * MIB)

    def limit(self, base: int, params: dict) -> float:
        """The most a run may show against a reference of ``base``: whichever allowance is larger."""
        tolerance, slack = self.allowance(params)
        return max(base * (1 + tolerance), base + slack)

    def passes_when(self, params, reference=None, where=""):
        tolerance, slack = self.allowance(params)
        text = f"at most the reference fix's `{self.stat}` plus {tolerance:.0%}"
        if slack:
            text += f", or plus {format_bytes(slack)} where that is more: the limit is max(reference × {1 + tolerance:g}, reference + {format_bytes(slack)})"
        base = (reference or {}).get(self.stat)
        if base is not None:
            text += (
                f". With the reference's {format_bytes(base)} on {where}: at most {format_bytes(int(self.limit(base, params)))}"
            )
        return text

    def evaluate(self, m, ref, params):
        value, base = _stat(m, self.stat), _stat(ref, self.stat)
        if value is None or base is None:
            return self.result(False, format_bytes(value), "n/a", "No memory figures were recorded for this run.")
        tolerance, _ = self.allowance(params)
        limit = self.limit(base, params)
        threshold = f"<= {format_bytes(limit)} (reference {format_bytes(base)} + {tolerance:.0%})"
        detail = f"{format_bytes(value)} is {value / max(base, 1):.2f}x the reference's {format_bytes(base)}. {self.advice}"
        return self.result(value <= limit, format_bytes(value), threshold, detail)


PEAK_ALLOCATED = RelativeBytes(
    "peak_allocated",
    "Peak allocated memory is what live tensors needed at the worst moment; the fix should bring it down to the reference's.",
    "Something still holds more memory at the peak than the reference does.",
)
PEAK_RESERVED = RelativeBytes(
    "peak_reserved",
    "Peak reserved memory is what the process took from the GPU, cached blocks included; it is what other jobs lose.",
    "The allocator still had to reserve more than the reference needs.",
)
INACTIVE_SPLIT_PEAK = RelativeBytes(
    "inactive_split_peak",
    "Non-releasable memory (inactive_split_bytes) is free space stranded inside segments that live blocks pin: fragmentation.",
    "Free memory is still stranded between live blocks; look at what is allocated among short-lived tensors.",
)


class Retries(Check):
    name = "retries"
    # After a failed cudaMalloc the allocator synchronizes and gives back its cached blocks that are not split
    # (release_cached_blocks in c10's CUDACachingAllocator.cpp), then asks again: not the whole cache.
    why = (
        "A retry means cudaMalloc failed and the allocator synchronized and gave back its unsplit cached blocks to find "
        "room: a slow step, and one short of an OOM."
    )
    params = {"max": int}
    earns_points = True

    def passes_when(self, params, reference=None, where=""):
        limit = params.get("max", 0)
        return (
            "no cache-flush retry (`num_alloc_retries` is 0)"
            if limit == 0
            else f"at most {limit} cache-flush retries (`num_alloc_retries`)"
        )

    def evaluate(self, m, ref, params):
        value, limit = _stat(m, "retries"), params.get("max", 0)
        if value is None:
            return self.result(False, "n/a", f"<= {limit}", "No allocator figures were recorded for this run.")
        detail = f"The allocator ran out of cached room {value} time(s) and had to give back cached blocks and retry."
        return self.result(value <= limit, str(value), f"<= {limit}", detail)


class SameWorkload(Check):
    name = "same_workload"
    why = "A memory fix must train the same model on the same data: less work is not a fix."
    params = {"padded": bool}  # inputs may be padded to shape buckets: their element counts are not compared

    def evaluate(self, m, ref, params):
        w, r = m.workload or {}, ref.workload or {}
        if not r:
            return self.result(False, "n/a", "n/a", "The reference recorded no workload.")
        summary = f"{w.get('optimizer_steps', 0)} steps, {w.get('train_samples', 0):,} train + {w.get('inference_samples', 0):,} inference samples"
        threshold = f"{r['optimizer_steps']} steps, {r['train_samples']:,} train + {r['inference_samples']:,} inference samples"
        problems = workload_differences(w, r, padded=params.get("padded", False))
        return self.result(not problems, summary, threshold, " ".join(problems))


def workload_differences(w: dict, r: dict, padded: bool = False) -> list[str]:
    """Each way ``w`` does less (or other) work than the reference ``r``, in words.

    ``padded``: padding to a few shapes is a fix (or the seeded bug is the lack
    of it), so the inputs' element counts are not compared; samples and steps
    still are, and the results check tells padding that kept the maths from
    truncation that did not.
    """
    differ = (lambda mine, theirs: False) if padded else (lambda mine, theirs: mine != theirs)
    problems = []
    if w.get("optimizer_steps", 0) != r["optimizer_steps"]:
        problems.append(
            f"It ran {w.get('optimizer_steps', 0)} optimizer steps; the reference runs {r['optimizer_steps']}. "
            "Fewer steps (or a run cut short) is not a fix."
        )
    else:
        for i, (mine, theirs) in enumerate(zip(w.get("samples_per_step", []), r["samples_per_step"], strict=True)):
            if mine != theirs:
                problems.append(
                    f"Step {i + 1} trained on {mine:,} samples; the reference trains on {theirs:,}. "
                    "A smaller batch is not a fix: the exercise keeps the batch size fixed."
                )
                break
    if differ(w.get("train_elements", 0), r["train_elements"]) and not problems:
        problems.append(
            f"Training inputs held {w.get('train_elements', 0):,} elements; the reference's hold {r['train_elements']:,}. "
            "Shorter or fewer sequences are not a fix."
        )
    if w.get("inference_samples", 0) != r["inference_samples"] or differ(w.get("inference_elements", 0), r["inference_elements"]):
        problems.append(
            f"Evaluation and other no-grad passes saw {w.get('inference_samples', 0):,} samples "
            f"({w.get('inference_elements', 0):,} elements); the reference sees {r['inference_samples']:,} "
            f"({r['inference_elements']:,}). Skipping evaluation or using less data is not a fix."
        )
    other = [d for d in w.get("devices", []) if d != "cuda"]
    if other:
        problems.append(f"Part of the model ran on {', '.join(other)}: the exercise's workload runs on the GPU.")
    return problems


class SameResults(Check):
    name = "same_results"
    why = (
        "A memory fix must not change what the model computes: the same loss at every optimizer step, "
        "the same final weights (or, for a worker that only serves, the same outputs), within tolerance."
    )
    params = {"rtol": float, "atol": float, "weights_rtol": float}

    def passes_when(self, params, reference=None, where=""):
        given = ", ".join(f"`{k} = {v}`" for k, v in params.items())
        return (
            "every step's loss, and the final weights' sum and norm, within `atol + rtol × abs(reference)` of the "
            "reference fix's (the rule of `numpy.isclose`)" + (f", with {given}" if given else "")
        )

    def evaluate(self, m, ref, params):
        rtol, atol = params.get("rtol", 1e-3), params.get("atol", 1e-5)
        w, r = m.workload or {}, ref.workload or {}
        threshold = f"rtol {rtol:g}"
        if not r.get("optimizer_steps") and "serving" in r:
            return self._outputs(w, r, rtol, atol, threshold)
        losses, ref_losses = w.get("losses", []), r.get("losses", [])
        if len(losses) != len(ref_losses):
            return self.result(
                False,
                f"{len(losses)} optimizer steps",
                f"{len(ref_losses)} optimizer steps",
                f"The optimizer stepped {len(losses)} times; the reference steps {len(ref_losses)} times.",
            )
        worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses, strict=True)), default=0.0)
        off = [i for i, (a, b) in enumerate(zip(losses, ref_losses, strict=True)) if not close(a, b, rtol, atol)]
        scale = losses[0] / ref_losses[0] if off and ref_losses and ref_losses[0] else None
        if scale and scale > 0 and all(close(a, scale * b, rtol, atol) for a, b in zip(losses, ref_losses, strict=True)):
            # Every step's loss the same multiple of the reference's (backward on the unscaled loss, gradients
            # divided afterwards): the same training if the final weights agree, which the lines below decide.
            off, worst = [], 0.0
        if off:
            step = off[0]
            return self.result(
                False,
                f"loss off by {worst:.1e}",
                threshold,
                f"At optimizer step {step + 1} the loss backpropagated is {losses[step]:.6g}; the reference's is "
                f"{ref_losses[step]:.6g}. The change altered what the optimizer sees. (Losses are summed per optimizer "
                "step: micro-batches whose losses are divided by their number add up to the whole batch's.)",
            )
        wtol = params.get("weights_rtol", WEIGHTS_RTOL)
        distance, why = weights.compare(m.weights_digest, ref.weights_digest)
        if distance is None or distance > wtol:
            said = why or f"they are {distance:.1e} apart (relative), more than {wtol:g}"
            return self.result(
                False,
                "weights differ" if why else f"weights off by {distance:.1e}",
                f"weights within {wtol:g} (relative, tensor by tensor)",
                f"The final weights, compared tensor by tensor with the reference's: {said}. The run did not train "
                "the model the reference trains.",
            )
        if problem := outputs_differ(w, r, rtol, atol):
            return self.result(False, "evaluation differs", threshold, problem)
        if scale and not off and not close(scale, 1.0, rtol, atol):
            return self.result(True, f"losses {scale:.3g}x the reference's, weights equal", threshold)
        return self.result(True, f"max loss diff {worst:.1e}, weights {distance:.0e}", threshold)

    def _outputs(self, w, r, rtol, atol, threshold):
        sums, ref_sums = (w.get("serving") or {}).get("output_sums", []), r["serving"]["output_sums"]
        if len(sums) != len(ref_sums):
            return self.result(
                False, f"{len(sums)} outputs", f"{len(ref_sums)} outputs", "The worker answered a different number of requests."
            )
        off = [i for i, (a, b) in enumerate(zip(sums, ref_sums, strict=True)) if not close(a, b, rtol, atol)]
        if off:
            i = off[0]
            return self.result(
                False,
                f"{len(off)} outputs differ",
                threshold,
                f"The output of request {i + 1} sums to {sums[i]:.6g}; the reference's to {ref_sums[i]:.6g}. "
                "The change altered what the worker answers.",
            )
        return self.result(True, f"{len(sums)} outputs equal", threshold)


def outputs_differ(w: dict, r: dict, rtol: float, atol: float) -> str:
    """What differs in what evaluation computed (the sums of every inference output), in words; "" when nothing does.

    Summed over all inference forwards, so an evaluation split into other
    batches agrees; one given other data, or none, does not.
    """
    mine, theirs = w.get("inference_outputs") or {}, r.get("inference_outputs") or {}
    if not theirs.get("digested"):
        return ""
    for key, label in (("sum", "sum"), ("sum_squares", "sum of squares")):
        a, b = mine.get(key), theirs[key]
        scale = max(abs(b), 1.0)
        if a is None or not close(a / scale, b / scale, rtol, atol):
            return (
                f"The outputs of the evaluation and other no-grad passes have a {label} of {a if a is None else f'{a:.6g}'}; "
                f"the reference's {b:.6g}. What is evaluated must be computed, not printed."
            )
    return ""


NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def logged_numbers(stdout: str, containing: str = "") -> list[float]:
    """The numbers a script printed, in order (the harness's own ``[oomlab]`` lines aside).

    ``containing`` keeps only the lines with that text in them: the evaluation's
    lines of a log whose other lines carry timings, which no two runs share.
    """
    lines = [line for line in stdout.splitlines() if not line.startswith("[oomlab]") and containing in line]
    return [float(n) for line in lines for n in NUMBER.findall(line)]


class SameLog(Check):
    name = "same_log"
    why = "Where the script's log is part of its job (monitoring, evaluation), the fix must still report the same numbers."
    params = {"rtol": float, "lines": str}  # lines: compare only the lines that contain this text

    def evaluate(self, m, ref, params):
        rtol, lines = params.get("rtol", 1e-3), params.get("lines", "")
        mine, theirs = logged_numbers(m.stdout, lines), logged_numbers(ref.stdout, lines)
        where = f" on lines with {lines!r}" if lines else ""
        threshold = f"{len(theirs)} numbers{where}, rtol {rtol:g}"
        if len(mine) != len(theirs):
            return self.result(
                False,
                f"{len(mine)} numbers",
                threshold,
                f"The script printed {len(mine)} numbers; the reference prints {len(theirs)}. Keep what the script "
                "reports: the monitoring or evaluation it prints is part of the job.",
            )
        # No atol parameter here: a fixed 1e-8 only lets numbers printed as (nearly) zero agree.
        off = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if not close(a, b, rtol, atol=1e-8)]
        if off:
            i = off[0]
            return self.result(
                False,
                f"{len(off)} numbers differ",
                threshold,
                f"Number {i + 1} of the log is {mine[i]:g}; the reference prints {theirs[i]:g}.",
            )
        return self.result(True, f"{len(mine)} numbers equal", threshold)


class BackwardPerStep(Check):
    name = "backward_per_step"
    why = "Micro-batching trades speed for memory: once the structural fixes are in, the batch should fit in one pass."
    params = {"max": int}

    def evaluate(self, m, ref, params):
        limit = params.get("max", 1)
        counts = (m.workload or {}).get("backward_per_step") or [0]
        most = max(counts)
        detail = (
            f"Some optimizer steps ran backward() {most} times: the batch is split into micro-batches, a "
            "hyperparameter-level change that trades speed for memory. Find the structural fix first; once it is "
            "in, the whole batch fits in one pass (hyperparameters last)."
        )
        return self.result(most <= limit, f"{most} per step", f"<= {limit} per step", detail)


class Plateau(Check):
    name = "plateau"
    earns_points = True
    why = "A long-lived worker must reach a steady state: memory that still grows after warm-up runs out one day."
    params = {"warmup": float, "slack_mib": float}

    def evaluate(self, m, ref, params):
        serving = (m.workload or {}).get("serving") or {}
        reserved, stranded = serving.get("reserved", []), serving.get("inactive_split", [])
        warmup, slack = params.get("warmup", 0.5), params.get("slack_mib", 32) * MIB
        cut = int(len(reserved) * warmup)
        if cut < 1 or cut >= len(reserved):
            return self.result(
                False, f"{len(reserved)} requests", "requests after warm-up", "Too few requests were served to judge."
            )
        growth = {
            "reserved": max(reserved[cut:]) - max(reserved[:cut]),
            "non-releasable": max(stranded[cut:]) - max(stranded[:cut]),
        }
        measured = ", ".join(f"{name} {'+' if g >= 0 else ''}{format_bytes(g)}" for name, g in growth.items())
        grew = [f"{name} memory grew by {format_bytes(g)}" for name, g in growth.items() if g > slack]
        threshold = f"growth <= {format_bytes(slack)} after the first {warmup:.0%} of {len(reserved)} requests"
        detail = "After warm-up " + " and ".join(grew) + ": the worker has no steady state yet."
        return self.result(not grew, measured, threshold, detail)


# Relative distance of final weights, tensor by tensor. On an H200 the honest fixes stay below 1e-3 (the same script
# run twice differs by up to 2e-4: some backward kernels add in no fixed order); another seed or less data lands near 1.
WEIGHTS_RTOL = 1e-2

# The witness's tolerances, from the truth check on an H200 (course/measurements/verify.json, each run's `witness`):
# between runs of honest fixes, the CUDA context at the end differs by the kernels each loads.
CONTEXT_SLACK_MIB = 64
# What a sample every few milliseconds can miss of a reserved peak that lasts less (a cache emptied right after it).
SAMPLING_SLACK = 0.10


def _mib(n: int | None) -> str:
    return format_bytes(n) if n is not None else "n/a"


class Witnessed(Check):
    """The driver, read from outside the measured process, against what the process says of its memory."""

    name = "driver"
    always = True
    why = (
        "The driver counts what the process really held on the GPU, and it is read from outside the run; the "
        "allocator's figures come from inside it, where a script could change them."
    )
    params = {"context_slack_mib": float}

    def evaluate(self, m, ref, params):
        w = m.witness or {}
        others = w.get("other_gpu_processes") or []
        if others:
            listed = "; ".join(f"pid {p['pid']} ({p['command'][:80]}) held {format_bytes(p['used_bytes'])}" for p in others)
            return self.result(
                False,
                f"{len(others)} other process(es) on the GPU",
                "the measured process alone",
                f"Another process of the run used the GPU: {listed}. The job has to run in the measured process, "
                "under its budget, where the grader can see it.",
            )
        driver = w.get("driver") or {}
        if not driver.get("available"):
            # Only a learner's own check gets here: a class's grading and the truth check refuse an unwitnessed
            # run as a machine problem (oomlab.grading.verdict.grade), and the report says why it was not.
            return self.result(True, "not witnessed", "witnessed where the driver can", "")
        stats = m.stats or {}
        peak, ready, at_figures = driver.get("peak_bytes"), driver.get("at_ready_bytes"), driver.get("at_figures_bytes")
        reserved_peak, reserved_final = stats.get("peak_reserved"), stats.get("reserved_final")
        slack = params.get("context_slack_mib", CONTEXT_SLACK_MIB) * MIB
        ref_context = context_at_end(ref)
        context = context_at_end(m)
        threshold = f"within {format_bytes(slack)} of the allocator's figures plus the CUDA context"
        if peak is None or reserved_peak is None or ready is None:
            return self.result(
                False,
                "no reading",
                threshold,
                "The driver never saw the measured process with its CUDA context, or the run recorded no memory figures.",
            )
        if context is not None and ref_context is not None and context - ref_context > slack:
            outside = context - ref_context
            return self.result(
                False,
                f"{format_bytes(outside)} outside the allocator",
                threshold,
                f"At the end of the run the driver counted {format_bytes(at_figures)} for the process: the allocator's "
                f"{format_bytes(reserved_final)} reserved and a CUDA context of {format_bytes(context)}, "
                f"{format_bytes(outside)} more than the reference's ({format_bytes(ref_context)}). That is device memory "
                "outside PyTorch's caching allocator (CuPy, cuMemAlloc, another library's own pool) or figures that do not "
                "match the process: the budget caps only the caching allocator.",
            )
        upper = reserved_peak + (context if context is not None else (ref_context or ready)) + slack
        if peak > upper:
            over = peak - (ref_context or ready) - (m.budget_bytes or 0)
            beyond = (
                f", {format_bytes(over)} more than the {format_bytes(m.budget_bytes)} budget lets the allocator reserve"
                if m.budget_bytes and over > slack
                else ""
            )
            return self.result(
                False,
                f"driver peak {format_bytes(peak)}",
                f"<= {format_bytes(upper)}",
                f"Figures disagree with the driver: it saw the process hold {format_bytes(peak)} at its peak{beyond}; the "
                f"allocator's peak reserved ({format_bytes(reserved_peak)}) and the CUDA context make "
                f"{format_bytes(upper - slack)}. Memory was held outside the figures the run reports: around the allocator, "
                "after they were read, or with its statistics reset or replaced.",
            )
        lower = reserved_peak + ready - slack - SAMPLING_SLACK * reserved_peak
        if peak < lower:
            return self.result(
                False,
                f"driver peak {format_bytes(peak)}",
                f">= {format_bytes(lower)}",
                f"Figures disagree with the driver: the run reports {format_bytes(reserved_peak)} reserved at its peak, "
                f"but the driver never saw the process hold more than {format_bytes(peak)}, its CUDA context "
                f"({format_bytes(ready)}) included.",
            )
        return self.result(True, f"driver peak {format_bytes(peak)}, context {_mib(context)}", threshold)


def context_at_end(m: Measurement | None) -> int | None:
    """What the driver counted beyond reserved when the figures were read: the CUDA context, and anything outside the allocator."""
    if m is None or not m.figures_witnessed:
        return None
    at = ((m.witness or {}).get("driver") or {}).get("at_figures_bytes")
    final = (m.stats or {}).get("reserved_final")
    return at - final if at is not None and final is not None else None


def script_cpu(m: Measurement | None) -> float | None:
    """CPU seconds of the run and everything it started, from the script's start on, as the kernel counted them."""
    return (m.witness or {}).get("script_cpu_s") if m is not None else None


def host_growth(m: Measurement | None) -> int | None:
    """How far the process's resident host memory rose above what it held when the script started (the kernel's peak)."""
    w = (m.witness or {}) if m is not None else {}
    peak, ready = w.get("maxrss_bytes"), w.get("rss_at_ready_bytes")
    return peak - ready if peak is not None and ready is not None else None


class CpuTime(Check):
    name = "cpu_time"
    always = True
    why = (
        "Work moved from the GPU to the CPU, or to another process, is work the GPU's memory figures never see; the "
        "kernel counts the CPU time of the run and everything it starts."
    )
    params = {"factor": float, "slack_s": float}

    def evaluate(self, m, ref, params):
        mine, theirs = script_cpu(m), script_cpu(ref)
        if mine is None or theirs is None:
            return self.result(False, "n/a", "n/a", "The kernel's CPU time of the run was not recorded.")
        factor, slack = params.get("factor", 3.0), params.get("slack_s", 20.0)
        limit = max(theirs * factor, theirs + slack)
        return self.result(
            mine <= limit,
            f"{mine:.1f} s",
            f"<= {limit:.1f} s (reference {theirs:.1f} s)",
            f"The run spent {mine:.1f} s of CPU time, its own processes included; the reference spends {theirs:.1f} s. "
            "Computing on the CPU what the reference computes on the GPU is not a memory fix.",
        )


class HostMemory(Check):
    name = "host_memory"
    always = True
    why = (
        "Tensors moved to the host (saved activations, caches kept with .cpu()) leave the GPU's figures and fill the "
        "host instead; the kernel counts the process's resident memory."
    )
    params = {"slack_mib": float, "tolerance": float}

    def evaluate(self, m, ref, params):
        mine, theirs = host_growth(m), host_growth(ref)
        if mine is None or theirs is None:
            return self.result(False, "n/a", "n/a", "The kernel's figure for the run's host memory was not recorded.")
        limit = max(theirs * (1 + params.get("tolerance", 0.25)), theirs + params.get("slack_mib", 1024) * MIB)
        return self.result(
            mine <= limit,
            f"+{format_bytes(max(mine, 0))}",
            f"<= +{format_bytes(limit)} (reference +{format_bytes(max(theirs, 0))})",
            f"The run's resident host memory grew by {format_bytes(max(mine, 0))} while it ran; the reference's by "
            f"{format_bytes(max(theirs, 0))}. Keeping on the host what the reference keeps on the GPU is not a fix here.",
        )


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        NoOom(),
        Untampered(),
        Settings(),
        PEAK_ALLOCATED,
        PEAK_RESERVED,
        INACTIVE_SPLIT_PEAK,
        Retries(),
        SameWorkload(),
        SameResults(),
        BackwardPerStep(),
        Plateau(),
        SameLog(),
        Witnessed(),
        CpuTime(),
        HostMemory(),
    )
}
# Every exercise gets these, whatever its manifest says (a manifest may still set their parameters).
ALWAYS = tuple(name for name, check in CHECKS.items() if check.always)


def validate(ex) -> None:
    """Raise :class:`OomLabError` unless every check the exercise's manifest names exists with parameters it takes,
    and every wrong fix expects a check the exercise runs: said before anything is measured."""
    manifest = ex.manifest_path
    for name, params in ex.checks.items():
        if name not in CHECKS:
            raise OomLabError(f"{manifest}: unknown check {name!r}.", f"Known checks: {', '.join(sorted(CHECKS))}.")
        CHECKS[name].validate(params, where=f"{manifest}: [checks.{name}]")
    for fix in ex.wrong_fixes:
        if fix.expect not in ex.checks and fix.expect not in ALWAYS:
            raise OomLabError(
                f"{manifest}: [[wrong_fixes]] expects check {fix.expect!r}, which this exercise does not have.",
                f"Name one of its checks: {', '.join([*ALWAYS, *(n for n in ex.checks if n not in ALWAYS)])}.",
            )


def run_checks(
    checks: dict[str, dict], m: Measurement, ref: Measurement | None, settings: dict | None = None
) -> list[CheckResult]:
    """Every check of the exercise and :data:`ALWAYS`; ``settings`` are the exercise's allocator settings, for ``settings``."""
    params = {**checks, "settings": {**checks.get("settings", {}), **(settings or {})}}
    names = list(ALWAYS) + [n for n in checks if n not in ALWAYS]
    return [CHECKS[name].evaluate(m, ref, params.get(name, {})) for name in names]
