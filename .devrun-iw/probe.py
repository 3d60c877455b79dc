"""GPU probe for the inference-worker exercise: measure bug, fix, alternatives and wrong fixes, capped and not.

One call on a GPU machine (torch with CUDA, this repo installed with ``pip install -e .``)::

    python .devrun-iw/probe.py                   # writes $OUT/iw.json (.devrun-iw/out/iw.json without $OUT)
    python .devrun-iw/probe.py --caps 1152,1184,1216,1280   # MiB, instead of caps derived from the fix
    python .devrun-iw/probe.py --dry-run --cpu-smoke        # no GPU: variants, checks, JSON, a CPU run

Every run goes through the grader's own measuring child (``oomlab.measure.harness.measure``
with ``serving=True``): a fresh process, the budget set with
``set_per_process_memory_fraction``, the grader's guards and workload hooks, reserved and
non-releasable bytes sampled after every outermost inference forward, each output's
float64 sum. Runs go in parallel (``--jobs``); the allocator's figures of one process do not
depend on what the others do.

Phase 1 runs every variant uncapped (the fix's peak reserved sets the candidate caps, the
outputs are compared with the fix's). Phase 2 runs the bug, the fix, the alternatives and the
wrong fixes whose verdict depends on memory at each cap (``--full``: every variant), the other
wrong fixes at one cap, and the bug also with other data seeds (``--seeds``): the OOM's request
number at each cap says how late in the replay the bug dies. At each cap the exercise's checks
are evaluated as the grader would, with the fix measured at that cap as the reference;
``candidates`` lists the caps where every variant behaves as the manifest says.

The JSON has, per run: status, the OOM (request number, line, first line of the message),
peaks (allocated, reserved, non-releasable), retries, the plateau figures the grader computes,
reserved/non-releasable every 50 requests, and the checks that pass or fail; per variant, how
its outputs compare with the fix's; and a summary table of caps against verdicts.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = "inference-worker"
MIB = 2**20
SAMPLE_EVERY = 50
SEED_LINE = "gen = torch.Generator(device=device).manual_seed(0)"
SETTINGS = {"alloc_conf": "", "learner_settings": False}
# Wrong fixes whose verdict depends on the budget: run at every cap (the rest at one).
CAP_SENSITIVE = ("wrong:empty-cache-each-request", "wrong:raise-restart-thresholds")


def load_manifest(root: Path) -> dict:
    with open(root / "exercises" / EXERCISE / "exercise.toml", "rb") as f:
        return tomllib.load(f)


def apply_edits(source: str, edits: list[dict], name: str) -> str:
    for edit in edits:
        count = source.count(edit["find"])
        if count != 1:
            raise SystemExit(f"{name}: edit expects {edit['find']!r} exactly once, found {count} times")
        source = source.replace(edit["find"], edit["replace"])
    return source


def variant_sources(root: Path, manifest: dict) -> dict[str, dict]:
    """name -> {"kind", "source", "expect"}: the bug, the reference fix, each alternative and wrong fix."""
    bug = (root / "exercises" / EXERCISE / "train.py").read_text(encoding="utf-8")
    fix = (root / "solutions" / EXERCISE / "train.py").read_text(encoding="utf-8")
    out = {
        "fix": {"kind": "solution", "source": fix, "expect": None},
        "bug": {"kind": "bug", "source": bug, "expect": manifest.get("symptom", "no_oom")},
    }
    for alt in manifest.get("alternatives", []):
        out[f"alt:{alt['name']}"] = {"kind": "alternative", "source": apply_edits(bug, alt["edits"], alt["name"]), "expect": None}
    for wrong in manifest.get("wrong_fixes", []):
        out[f"wrong:{wrong['name']}"] = {
            "kind": "wrong-fix",
            "source": apply_edits(bug, wrong["edits"], wrong["name"]),
            "expect": wrong["expect"],
        }
    return out


def with_seed(source: str, seed: int) -> str:
    if seed == 0:
        return source
    if source.count(SEED_LINE) != 1:
        raise SystemExit(f"the data generator line {SEED_LINE!r} is not in the script exactly once")
    return source.replace(SEED_LINE, SEED_LINE.replace("manual_seed(0)", f"manual_seed({seed})"))


def summarize(m, budget_bytes: int | None) -> dict:
    """One measurement as JSON: ending, peaks, retries, OOM, samples, the grader's plateau figures."""
    stats = m.stats or {}
    w = m.workload or {}
    serving = w.get("serving") or {}
    reserved, stranded = serving.get("reserved", []), serving.get("inactive_split", [])
    row = {
        "budget_mib": None if budget_bytes is None else round(budget_bytes / MIB, 1),
        "status": m.status,
        "oom": bool(m.oom),
        "requests_served": len(reserved),
        "wall_s": None if m.wall_s is None else round(m.wall_s, 2),
        "process_s": None if m.process_s is None else round(m.process_s, 2),
        "runner": m.runner,
        "alloc_conf": m.alloc_conf,
        "gpu": m.gpu,
        "torch": m.torch,
        **{
            k: (round(v / MIB, 1) if isinstance(v, int) and k not in ("retries", "ooms", "segments_peak") else v)
            for k, v in stats.items()
        },
        "inference_forwards": w.get("inference_forwards"),
        "inference_samples": w.get("inference_samples"),
        "inference_elements": w.get("inference_elements"),
        "samples_every_50": [
            {"request": i + 1, "reserved_mib": round(reserved[i] / MIB, 1), "non_releasable_mib": round(stranded[i] / MIB, 1)}
            for i in range(SAMPLE_EVERY - 1, len(reserved), SAMPLE_EVERY)
        ],
    }
    row["monitor_lines"] = [line for line in (m.stdout or "").splitlines() if line.strip()][-24:]  # the worker's own log
    if reserved:
        cut = int(len(reserved) * 0.5)
        if 0 < cut < len(reserved):
            row["plateau_growth_mib"] = {
                "reserved": round((max(reserved[cut:]) - max(reserved[:cut])) / MIB, 1),
                "non_releasable": round((max(stranded[cut:]) - max(stranded[:cut])) / MIB, 1),
            }
        row["last_sample"] = {"reserved_mib": round(reserved[-1] / MIB, 1), "non_releasable_mib": round(stranded[-1] / MIB, 1)}
    if m.status != "ok":
        row["where"] = m.where
        row["line"] = m.line
        row["message"] = (m.message or "").strip().splitlines()[0][:400] if m.message else ""
        row["oom_request"] = len(reserved) + 1 if m.status == "oom" else None
        if m.status not in ("ok", "oom"):
            row["stderr_tail"] = (m.stderr or "")[-1500:]
    return row


def compare_outputs(sums: list[float], ref: list[float], rtol: float, atol: float = 1e-5) -> dict:
    n = min(len(sums), len(ref))
    off = [i for i in range(n) if abs(sums[i] - ref[i]) > atol + rtol * abs(ref[i])]
    worst = max((abs(sums[i] - ref[i]) / max(abs(ref[i]), 1e-12) for i in range(n)), default=0.0)
    return {
        "compared": n,
        "lengths": [len(sums), len(ref)],
        "differ": len(off),
        "first_differing_request": off[0] + 1 if off else None,
        "max_rel_diff": worst,
        "identical": n == len(ref) == len(sums) and all(sums[i] == ref[i] for i in range(n)),
    }


def evaluate_checks(manifest: dict, m, ref) -> dict:
    """The exercise's checks on ``m`` with ``ref`` (the fix at the same cap) as the grader's reference."""
    try:
        from oomlab.grading.checks import run_checks
    except Exception as err:  # the grader changed: the figures above still stand
        return {"error": f"{type(err).__name__}: {err}"}
    results = run_checks(manifest.get("checks", {}), m, ref, SETTINGS)
    return {r.name: {"passed": r.passed, "measured": r.measured, "threshold": r.threshold, "detail": r.detail} for r in results}


def derived_caps(fix_peak_reserved: int, offsets_mib: list[int]) -> list[int]:
    """Candidate budgets in bytes: the fix's peak reserved plus each offset, rounded up to 16 MiB."""
    step = 16 * MIB
    return sorted({-(-(fix_peak_reserved + o * MIB) // step) * step for o in offsets_mib})


def run_all(args) -> dict:
    from oomlab.measure.harness import measure

    manifest = load_manifest(ROOT)
    rtol = float(manifest.get("checks", {}).get("same_results", {}).get("rtol", 1e-4))
    variants = variant_sources(ROOT, manifest)
    if args.only:
        keep = set(args.only.split(","))
        variants = {k: v for k, v in variants.items() if k in keep or k in ("fix", "bug")}
    work = Path(tempfile.mkdtemp(prefix="iw-probe-"))
    time_limit = float(manifest.get("time_limit_s", 120))
    report: dict = {
        "exercise": EXERCISE,
        "manifest_budget_mib": manifest.get("budget_bytes", 0) / MIB,
        "variants": {k: {"kind": v["kind"], "expect": v["expect"]} for k, v in variants.items()},
        "runs": {},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    measurements: dict = {}

    scripts: dict[tuple[str, int], Path] = {}
    for name in variants:  # written once, before any thread runs them
        for seed in sorted({0, *args.seeds}) if name == "bug" else [0]:
            path = work / f"{re.sub(r'[^A-Za-z0-9]+', '_', name)}_s{seed}" / "train.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(with_seed(variants[name]["source"], seed), encoding="utf-8")
            scripts[name, seed] = path

    def script_for(name: str, seed: int) -> Path:
        return scripts[name, seed]

    def one(name: str, cap: int | None, seed: int = 0):
        key = f"{name}|{'uncapped' if cap is None else round(cap / MIB)}|seed{seed}"
        t0 = time.perf_counter()
        try:
            m = measure(script_for(name, seed), budget_bytes=cap, time_limit_s=time_limit, serving=True)
        except Exception:
            return key, None, {"status": "probe_error", "traceback": traceback.format_exc()[-2000:]}
        row = summarize(m, cap)
        row["probe_wall_s"] = round(time.perf_counter() - t0, 1)
        return key, m, row

    def batch(jobs: list[tuple]) -> None:
        with futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for key, m, row in pool.map(lambda j: one(*j), jobs):
                report["runs"][key] = row
                measurements[key] = m
                print(
                    f"[probe] {key}: {row.get('status')} {('at request ' + str(row.get('oom_request'))) if row.get('oom') else ''} "
                    f"peak reserved {row.get('peak_reserved')} MiB, retries {row.get('retries')}",
                    flush=True,
                )

    t0 = time.perf_counter()
    # Phase 1: everything uncapped.
    batch([(name, None) for name in variants])
    fix_key = "fix|uncapped|seed0"
    fix_m = measurements.get(fix_key)
    if fix_m is None or not fix_m.stats:
        report["error"] = "the fix did not run uncapped; see runs"
        return report
    fix_sums = (fix_m.workload or {}).get("serving", {}).get("output_sums", [])
    report["outputs_vs_fix"] = {
        name: compare_outputs(
            (measurements[f"{name}|uncapped|seed0"].workload or {}).get("serving", {}).get("output_sums", []), fix_sums, rtol
        )
        for name in variants
        if measurements.get(f"{name}|uncapped|seed0") is not None and measurements[f"{name}|uncapped|seed0"].workload
    }
    fix_peak = fix_m.stats["peak_reserved"]
    caps = [c * MIB for c in args.caps] if args.caps else derived_caps(fix_peak, args.offsets)
    report["caps_mib"] = [round(c / MIB) for c in caps]
    report["fix_uncapped_peak_reserved_mib"] = round(fix_peak / MIB, 1)

    # Phase 2: bug, fix, alternatives and the wrong fixes whose verdict depends on memory at every cap; the
    # others (caught by settings, workload or results whatever the budget) at one cap; the bug with other seeds.
    every_cap = [n for n in variants if n in ("bug", "fix") or n.startswith("alt:") or n in CAP_SENSITIVE or args.full]
    middle = caps[len(caps) // 2 - 1] if len(caps) > 1 else caps[0]
    jobs = [(name, cap) for cap in caps for name in every_cap]
    jobs += [(name, middle) for name in variants if name not in every_cap]
    jobs += [("bug", cap, seed) for seed in args.seeds if seed != 0 for cap in caps]
    jobs += [("bug", None, seed) for seed in args.seeds if seed != 0]
    batch(jobs)

    # The grader's checks at each cap, the fix at that cap as the reference.
    manifest_checks = {}
    for cap in caps:
        ref = measurements.get(f"fix|{round(cap / MIB)}|seed0")
        table = {}
        for name in variants:
            m = measurements.get(f"{name}|{round(cap / MIB)}|seed0")
            if m is None or ref is None:
                continue
            checks = evaluate_checks(manifest, m, ref)
            failed = sorted(k for k, v in checks.items() if isinstance(v, dict) and not v.get("passed"))
            expect = variants[name]["expect"]
            table[name] = {
                "failed": failed,
                "as_expected": (not failed) if expect is None else (expect in failed),
                "expected_failure": expect,
                "checks": checks,
            }
        manifest_checks[str(round(cap / MIB))] = table
    report["checks_at_cap"] = manifest_checks

    summary = []
    for cap in caps:
        c = str(round(cap / MIB))
        line = {
            "cap_mib": round(cap / MIB),
            "all_as_expected": all(v["as_expected"] for v in manifest_checks.get(c, {}).values()),
        }
        for name in variants:
            row = report["runs"].get(f"{name}|{c}|seed0", {})
            line[name] = {
                "status": row.get("status"),
                "oom_request": row.get("oom_request"),
                "peak_reserved_mib": row.get("peak_reserved"),
                "inactive_split_peak_mib": row.get("inactive_split_peak"),
                "retries": row.get("retries"),
                "failed_checks": manifest_checks.get(c, {}).get(name, {}).get("failed"),
            }
        line["bug_other_seeds"] = {
            seed: {k: report["runs"].get(f"bug|{c}|seed{seed}", {}).get(k) for k in ("status", "oom_request", "retries")}
            for seed in args.seeds
            if seed != 0
        }
        summary.append(line)
    report["summary"] = summary
    # Budgets that work: every variant as the manifest says, and the bug dying (late) under every data seed.
    report["candidates"] = [
        {
            "cap_mib": line["cap_mib"],
            "fix_peak_reserved_mib": line["fix"]["peak_reserved_mib"],
            "bug_oom_request_by_seed": {
                0: line["bug"]["oom_request"],
                **{s: v.get("oom_request") for s, v in line["bug_other_seeds"].items()},
            },
        }
        for line in summary
        if line["all_as_expected"]
        and line["bug"]["status"] == "oom"
        and all(v.get("status") == "oom" for v in line["bug_other_seeds"].values())
    ]
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    return report


def dry_run(args) -> dict:
    """No GPU: the variants apply and compile, the harness and checks import, and, with torch installed,
    a shrunken bug and fix run on the CPU through the grader's child to exercise the plumbing."""
    manifest = load_manifest(ROOT)
    variants = variant_sources(ROOT, manifest)
    out: dict = {"variants": {}, "caps_example_mib": [round(c / MIB) for c in derived_caps(1154 * MIB, args.offsets)]}
    for name, v in variants.items():
        compile(v["source"], name, "exec")
        out["variants"][name] = {
            "kind": v["kind"],
            "expect": v["expect"],
            "compiles": True,
            "seed_line": v["source"].count(SEED_LINE),
        }
        with_seed(v["source"], 1)
    from oomlab.grading.checks import CHECKS
    from oomlab.measure.harness import Measurement, measure  # noqa: F401

    unknown = [c for c in manifest.get("checks", {}) if c not in CHECKS]
    out["unknown_checks"] = unknown
    # The checks on fabricated measurements: a flat worker against a creeping one.
    flat = {"reserved": [1000 * MIB] * 100, "inactive_split": [10 * MIB] * 100, "output_sums": [float(i) for i in range(100)]}
    creep = {
        "reserved": [(900 + 3 * i) * MIB for i in range(100)],
        "inactive_split": [i * MIB for i in range(100)],
        "output_sums": flat["output_sums"],
    }
    wl = {
        "optimizer_steps": 0,
        "samples_per_step": [],
        "train_samples": 0,
        "train_elements": 0,
        "inference_samples": 100,
        "inference_elements": 2400,
        "devices": ["cuda"],
    }
    stats = {"peak_allocated": 900 * MIB, "peak_reserved": 1000 * MIB, "inactive_split_peak": 20 * MIB, "retries": 0, "ooms": 0}
    ref = Measurement(script="fix", status="ok", stats=stats, workload={**wl, "serving": flat})
    bad = Measurement(
        script="bug", status="ok", stats={**stats, "inactive_split_peak": 200 * MIB}, workload={**wl, "serving": creep}
    )
    out["checks_fabricated"] = {
        "fix_vs_fix": evaluate_checks(manifest, ref, ref),
        "creep_vs_fix": {k: v["passed"] for k, v in evaluate_checks(manifest, bad, ref).items()},
    }
    out["summarize_fabricated"] = summarize(bad, 1024 * MIB)
    if args.cpu_smoke:
        out["cpu_smoke"] = cpu_smoke(variants)
    return out


CPU_SIZES = {
    "vocab_size, d_model, n_heads, n_layers, max_len = 8192, 768, 12, 6, 4096": "vocab_size, d_model, n_heads, n_layers, max_len = 512, 64, 4, 2, 256",
    "n_agents, n_requests, min_tokens, max_tokens = 6, 1000, 12, 37": "n_agents, n_requests, min_tokens, max_tokens = 3, 120, 4, 16",
}


def cpu_smoke(variants: dict) -> dict:
    """Shrunken copies on the CPU through the grader's child (no budget, no allocator figures)."""
    from oomlab.measure.harness import measure

    work = Path(tempfile.mkdtemp(prefix="iw-cpu-"))
    fake = (
        "FAKE = {'reserved_bytes.all.current': 1, 'allocated_bytes.all.current': 1, "
        "'inactive_split_bytes.all.current': 0, 'num_alloc_retries': 0, 'num_ooms': 0}\n"
    )
    results = {}
    for name in ("bug", "fix"):
        src = variants[name]["source"]
        for a, b in CPU_SIZES.items():
            src = src.replace(a, b)
        src = src.replace('device = "cuda"', 'device = "cpu"')
        src = src.replace(
            "AllocatorMonitor(device=0, registry=registry)", "AllocatorMonitor(device=0, registry=registry, stats=lambda: FAKE)"
        )
        src = src.replace("torch.cuda.memory_stats()", "FAKE")
        src = src.replace("import torch\n", "import torch\n" + fake, 1)
        path = work / name / "train.py"
        path.parent.mkdir(parents=True)
        path.write_text(src, encoding="utf-8")
        m = measure(path, budget_bytes=None, require_cuda=False, serving=True, time_limit_s=300)
        results[name] = {
            "status": m.status,
            "message": (m.message or "")[:300],
            "stdout_tail": (m.stdout or "")[-400:],
            "inference_forwards": (m.workload or {}).get("inference_forwards"),
            "summary": summarize(m, None),
        }
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caps", type=lambda s: [int(x) for x in s.split(",") if x], default=None, help="caps in MiB")
    ap.add_argument(
        "--offsets",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[16, 48, 96, 160],
        help="caps derived as the fix's uncapped peak reserved + these MiB (default 16,48,96,160)",
    )
    ap.add_argument("--full", action="store_true", help="every variant at every cap (slower)")
    ap.add_argument(
        "--seeds",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[0, 1, 2],
        help="data seeds for the bug (the script's generator seed); 0 is the exercise's own",
    )
    ap.add_argument("--jobs", type=int, default=min(10, os.cpu_count() or 4))
    ap.add_argument("--only", default="", help="comma-separated variant names besides bug and fix")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: validate variants, checks and JSON")
    ap.add_argument("--cpu-smoke", action="store_true", help="with --dry-run: run shrunken bug and fix on the CPU")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    out_dir = Path(os.environ.get("OUT") or ROOT / ".devrun-iw" / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = dry_run(args) if args.dry_run else run_all(args)
    path = out_dir / ("iw-dry.json" if args.dry_run else "iw.json")
    path.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print(f"[probe] wrote {path}")
    if not args.dry_run:
        for line in report.get("summary", []):
            short = {}
            for k, v in line.items():
                if isinstance(v, dict) and k != "bug_other_seeds":
                    v = {kk: vv for kk, vv in v.items() if kk in ("status", "oom_request", "peak_reserved_mib", "failed_checks")}
                short[k] = v
            print(json.dumps(short))
    return 0


if __name__ == "__main__":
    sys.exit(main())
