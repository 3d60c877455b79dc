"""Named checks: a measurement against the reference solution and the exercise's thresholds.

Every check says what it measured, what it compared with, whether it passed,
and in one sentence why it matters. Thresholds relative to the reference come
from the reference solution measured on the same GPU and torch version.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.errors import OomLabError
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
    """One kind of check. Subclasses set ``name``, ``why``, ``params`` and ``evaluate``."""

    name = ""
    why = ""
    params: dict[str, type] = {}

    def validate(self, given: dict, where: str) -> None:
        for key, value in given.items():
            if key not in self.params:
                allowed = ", ".join(self.params) or "none"
                raise OomLabError(f"{where}: unknown parameter {key!r}.", f"Allowed: {allowed}.")
            kind = self.params[key]
            if not isinstance(value, (int, float) if kind is float else kind) or isinstance(value, bool):
                raise OomLabError(f"{where}: {key} should be a {kind.__name__}, found {value!r}.", "")

    def evaluate(self, m: Measurement, ref: Measurement | None, params: dict) -> CheckResult:
        raise NotImplementedError

    def result(self, passed: bool, measured: str, threshold: str, detail: str = "") -> CheckResult:
        return CheckResult(self.name, passed, measured, threshold, self.why, "" if passed else detail)


def _stat(m: Measurement | None, key: str) -> int | None:
    return None if m is None or m.stats is None else m.stats.get(key)


class NoOom(Check):
    name = "no_oom"
    why = "The run has to fit the exercise's memory budget: an out-of-memory error ends a real training job."

    def evaluate(self, m, ref, params):
        if m.oom:
            where = f" at {m.where}" if m.where else ""
            first = first_line(m.message, None) or "CUDA out of memory"
            caught = "" if m.status == "oom" else " (the script caught it and went on)"
            return self.result(False, f"OOM{where}", "no OOM", f"{first}{caught}")
        return self.result(True, "no OOM", "no OOM")


class Untampered(Check):
    name = "untampered"
    why = "The grader reads the allocator's own statistics; a run that resets them or lifts the budget proves nothing."

    def evaluate(self, m, ref, params):
        problems = list(m.tamper)
        peak = _stat(m, "peak_reserved")
        if peak is not None and m.budget_bytes and peak > m.budget_bytes:
            problems.append(f"reserved {format_bytes(peak)}, more than the {format_bytes(m.budget_bytes)} budget")
        if problems:
            return self.result(False, "; ".join(problems), "statistics untouched", "The script " + "; ".join(problems) + ".")
        return self.result(True, "statistics untouched", "statistics untouched")


class RelativeBytes(Check):
    """A peak figure no more than the reference's, times (1 + tolerance), or plus a slack in MiB if that is larger."""

    params = {"tolerance": float, "slack_mib": float}

    def __init__(self, stat: str, why: str, advice: str):
        self.name = self.stat = stat  # the check is named after the figure it reads
        self.why = why
        self.advice = advice

    def evaluate(self, m, ref, params):
        value, base = _stat(m, self.stat), _stat(ref, self.stat)
        if value is None or base is None:
            return self.result(False, format_bytes(value), "n/a", "No memory figures were recorded for this run.")
        tolerance = params.get("tolerance", 0.10)
        limit = max(base * (1 + tolerance), base + params.get("slack_mib", 0) * MIB)
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
    why = (
        "A retry means the allocator flushed its whole cache and synchronized to find room: a slow step, and one short of an OOM."
    )
    params = {"max": int}

    def evaluate(self, m, ref, params):
        value, limit = _stat(m, "retries"), params.get("max", 0)
        if value is None:
            return self.result(False, "n/a", f"<= {limit}", "No allocator figures were recorded for this run.")
        detail = f"The allocator ran out of cached room {value} time(s) and had to free its cache and retry."
        return self.result(value <= limit, str(value), f"<= {limit}", detail)


class SameWorkload(Check):
    name = "same_workload"
    why = "A memory fix must train the same model on the same data: less work is not a fix."

    def evaluate(self, m, ref, params):
        w, r = m.workload or {}, ref.workload or {}
        if not r:
            return self.result(False, "n/a", "n/a", "The reference recorded no workload.")
        summary = f"{w.get('optimizer_steps', 0)} steps, {w.get('train_samples', 0):,} train + {w.get('inference_samples', 0):,} inference samples"
        threshold = f"{r['optimizer_steps']} steps, {r['train_samples']:,} train + {r['inference_samples']:,} inference samples"
        return self.result(not (problems := workload_differences(w, r)), summary, threshold, " ".join(problems))


def workload_differences(w: dict, r: dict) -> list[str]:
    """Each way ``w`` does less (or other) work than the reference ``r``, in words."""
    problems = []
    if w.get("optimizer_steps", 0) != r["optimizer_steps"]:
        problems.append(
            f"It ran {w.get('optimizer_steps', 0)} optimizer steps; the reference runs {r['optimizer_steps']}. "
            "Fewer steps (or a run cut short) is not a fix."
        )
    else:
        for i, (mine, theirs) in enumerate(zip(w["samples_per_step"], r["samples_per_step"], strict=True)):
            if mine != theirs:
                problems.append(
                    f"Step {i + 1} trained on {mine:,} samples; the reference trains on {theirs:,}. "
                    "A smaller batch is not a fix: the exercise keeps the batch size fixed."
                )
                break
    if w.get("train_elements", 0) != r["train_elements"] and not problems:
        problems.append(
            f"Training inputs held {w.get('train_elements', 0):,} elements; the reference's hold {r['train_elements']:,}. "
            "Shorter or fewer sequences are not a fix."
        )
    if (w.get("inference_samples", 0), w.get("inference_elements", 0)) != (r["inference_samples"], r["inference_elements"]):
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
    why = "A memory fix must not change what the model computes: same losses, same final weights, within tolerance."
    params = {"rtol": float, "atol": float}

    def evaluate(self, m, ref, params):
        rtol, atol = params.get("rtol", 1e-3), params.get("atol", 1e-5)
        w, r = m.workload or {}, ref.workload or {}
        threshold = f"rtol {rtol:g}"
        losses, ref_losses = w.get("losses", []), r.get("losses", [])
        if len(losses) != len(ref_losses):
            return self.result(
                False,
                f"{len(losses)} losses",
                f"{len(ref_losses)} losses",
                f"backward() ran {len(losses)} times on a scalar loss; the reference runs it {len(ref_losses)} times.",
            )
        close = lambda a, b: abs(a - b) <= atol + rtol * abs(b)  # noqa: E731 - numpy.isclose's rule
        worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses, strict=True)), default=0.0)
        off = [i for i, (a, b) in enumerate(zip(losses, ref_losses, strict=True)) if not close(a, b)]
        if off:
            step = off[0]
            return self.result(
                False,
                f"loss off by {worst:.1e}",
                threshold,
                f"At step {step + 1} the loss is {losses[step]:.6g}; the reference's is {ref_losses[step]:.6g}. "
                "The change altered what the model computes.",
            )
        for key, label in (("weights_sum", "sum"), ("weights_norm", "norm")):
            mine, theirs = w.get(key), r.get(key)
            if mine is None or theirs is None or not close(mine, theirs):
                return self.result(
                    False,
                    f"weights {label} {mine}",
                    f"{theirs} ({threshold})",
                    f"The final weights differ from the reference's ({label} {mine} vs {theirs}).",
                )
        return self.result(True, f"max loss diff {worst:.1e}", threshold)


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        NoOom(),
        Untampered(),
        PEAK_ALLOCATED,
        PEAK_RESERVED,
        INACTIVE_SPLIT_PEAK,
        Retries(),
        SameWorkload(),
        SameResults(),
    )
}
ALWAYS = ("untampered",)  # every exercise gets these, whatever its manifest says


def run_checks(checks: dict[str, dict], m: Measurement, ref: Measurement | None) -> list[CheckResult]:
    names = list(ALWAYS) + [n for n in checks if n not in ALWAYS]
    return [CHECKS[name].evaluate(m, ref, checks.get(name, {})) for name in names]
