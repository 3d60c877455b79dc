"""What this machine can measure: ``oomlab doctor``, and the message when the machine stops a run."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.measure.stats import ALLOC_CONF_VARS
from oomlab.units import GIB, in_gib


def machine_error(m, exercise) -> OomLabError:
    """The machine, not the script, stops the measurement: say what and what to do."""
    budget = f"{in_gib(exercise.budget_bytes)}"
    if m.status == "no_torch":
        return OomLabError("PyTorch is not installed in this Python environment.", "Run `make start`, which installs it.")
    if m.status == "torch_too_old":
        return OomLabError(f"{m.message}; the course needs torch 2.4 or newer.", "Upgrade it: pip install -U torch")
    if m.status == "no_cuda":
        return OomLabError(f"No CUDA GPU is visible: {m.message}.", WITHOUT_A_GPU)
    if m.status == "gpu_too_small":
        return OomLabError(
            f"This GPU ({m.gpu}, {in_gib(m.gpu_total_bytes)}) is smaller than {exercise.id}'s budget of {budget}.",
            f"Use a GPU with at least {budget} of memory.",
        )
    if m.status == "gpu_busy":
        return OomLabError(
            f"Other processes hold memory on {m.gpu}: {in_gib(m.gpu_free_bytes)} is free.",
            f"{exercise.id} needs {budget} free. `nvidia-smi` lists who holds it; stop them and try again.",
        )
    return OomLabError(f"The measurement could not start: {m.status}: {m.message}", "Run `oomlab doctor`.")


# What a measuring process holds on the GPU beyond its budget: the CUDA context, the kernels it loads
# and library workspaces. `oomlab dev facts` measured 742 MiB on an H200 (course/measurements/facts.json,
# cuda_context); 1 GiB leaves a margin for other GPUs and drivers.
CONTEXT_BYTES = 1 * GIB


WITHOUT_A_GPU = (
    "Without one, `oomlab list`, `hint`, `interview` and `reset` still work, `oomlab run` shows an estimate "
    "exercise's answers beside the CPU's count, and `oomlab snapshot` and `compare` read snapshots saved elsewhere; "
    "`oomlab doctor` lists them."
)


def has_nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver at all (``nvidia-smi`` on the PATH, or ``/proc/driver/nvidia``)."""
    return shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia")


def no_driver(what: str) -> OomLabError:
    """The error of a machine with no NVIDIA driver, where ``what`` ("measuring train.py") needs a GPU."""
    return OomLabError(
        f"This machine has no NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia): {what} needs an NVIDIA GPU.",
        WITHOUT_A_GPU,
    )


def why_no_gpu() -> str:
    """Why this machine cannot measure a run on a GPU, or "" when it can: the driver first, torch only if there is one."""
    if not has_nvidia_driver():
        return "this machine has no NVIDIA driver"
    try:
        import torch
    except ImportError:
        return f"PyTorch is not installed in {sys.executable}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return ""


def refuse_without_a_driver(script: Path, what: str) -> None:
    """Say at once, before torch is imported (seconds), that a machine with no NVIDIA driver cannot measure ``script``.

    A missing file or a syntax error is left to the measurement, which reports both without a GPU, so that
    the learner hears of them wherever they work.
    """
    from oomlab.measure.harness import check_syntax

    if has_nvidia_driver():
        return
    try:
        source = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    if check_syntax(script, source) is None:
        raise no_driver(what)


def without_a_gpu() -> list[tuple[str, str]]:
    """What still works on a machine with no NVIDIA GPU: (command, what it gives), for ``oomlab doctor``."""
    from oomlab.course import find_root
    from oomlab.course.shipped import SNAPSHOTS, shipped_root

    places = [shipped_root()]
    with contextlib.suppress(OomLabError):
        places.insert(0, find_root())
    works = [
        ("oomlab list", "every exercise and your progress (`oomlab` alone: what to do next)"),
        ("oomlab hint ID", "the hints, one more each time"),
        ("oomlab interview ID", "the interview question an exercise prepares you for (--answer: a model answer)"),
        ("oomlab reset ID", "the original exercise back, your version kept"),
        ("oomlab run ID", "of an exercise sized before it runs: your estimate beside the CPU's count of each example"),
    ]
    places = [p for p in places if p is not None]
    source = next((p for p in places if (p / "Makefile").is_file() and (p / "course").is_dir()), None)
    if source is not None:
        here = "" if source.resolve() == Path.cwd().resolve() else f" (in {source})"
        works.append(("make docs", f"the course site, with every exercise's pages and pictures{here}"))
    # Snapshots taken on a real GPU: a checkout's figures, or the two a wheel ships (oomlab init copies them).
    folders = [folder for p in places for folder in (p / "course" / "figures", p / SNAPSHOTS)]  # the learner's first
    bug = next((f for folder in folders for f in sorted(folder.glob("*-bug-snapshot.pickle"))), None)
    fix = bug.with_name(bug.name.replace("-bug-", "-fix-")) if bug else None
    if bug is not None:
        works.append((f"oomlab snapshot {_from_here(bug)}", "read a snapshot the course ships, taken on a real GPU"))
    if fix is not None and fix.is_file():
        works.append((f"oomlab compare {_from_here(bug)} {_from_here(fix)}", "the bug's snapshot and the fix's, side by side"))
    return works


def _from_here(path: Path) -> Path:
    cwd, path = Path.cwd().resolve(), path.resolve()
    return path.relative_to(cwd) if path.is_relative_to(cwd) else path


def gpu_free_bytes() -> int | None:
    """Free memory on the first visible GPU, as the driver reports it (without starting CUDA here); None if unknown."""
    if shutil.which("nvidia-smi") is None:
        return None
    device = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        out = subprocess.run(
            ["nvidia-smi", "-i", device, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return int(out.split()[0]) * (1 << 20)  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def parallel_runs(budgets: list[int]) -> int:
    """How many measuring processes fit at once: one per core, as far as the GPU's free memory holds the largest."""
    free = gpu_free_bytes()
    if free is None or not budgets:
        return 1
    return max(1, min(os.cpu_count() or 1, free // (max(budgets) + CONTEXT_BYTES)))


def sandbox_row() -> tuple[str, str, str]:
    """Whether a graded run can be kept from the answers here (:mod:`oomlab.measure.sandbox`)."""
    from oomlab.measure import socket_filter
    from oomlab.measure.sandbox import availability

    abi, why = availability()
    if abi:
        try:
            socket_filter.program()
        except socket_filter.Unavailable as err:
            return ("warn", "sandbox", f"Landlock (ABI {abi}), but {err}: an estimate cannot be graded here")
        return ("ok", "sandbox", f"Landlock (ABI {abi}): a graded script cannot read the answers, nor an estimator open a socket")
    return ("warn", "sandbox", f"{why}: your own checks run unsandboxed and say so; a class cannot be graded here")


def witness_row() -> tuple[str, str, str]:
    """Whether the driver can witness runs here: NVML answers (whether it names this namespace's processes shows per run)."""
    from oomlab.measure.witness import Driver

    driver = Driver()
    if not driver.start():
        return ("warn", "driver witness", f"{driver.reason}: your own checks say so; a class cannot be graded here")
    try:
        devices = len(driver.handles)
    finally:
        driver.stop()
    return ("ok", "driver witness", f"NVML answers for {devices} GPU(s); each run checks that it is listed by its process id")


def distributed_row(torch) -> tuple[str, str, str]:
    """Which torchrun jobs the tools can run here (``oomlab hunt torchrun --nproc-per-node N``): by backend, how many ranks.

    gloo ranks can share a GPU, each under its own budget; NCCL takes one GPU per rank and
    refuses two ranks on one ("Duplicate GPU detected").
    """
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return ("warn", "torchrun jobs", "this torch has no torch.distributed: the tools run scripts of one process only")
    gpus = torch.cuda.device_count()
    found = []
    if dist.is_gloo_available():
        found.append("gloo: any number of ranks, sharing the GPUs")
    if dist.is_nccl_available():
        found.append(f"NCCL: up to {gpus} rank{'' if gpus == 1 else 's'}, one GPU each")
    if not found:
        return ("warn", "torchrun jobs", "torch.distributed has neither gloo nor NCCL here: a job cannot start")
    return ("ok", "torchrun jobs", "; ".join(found))


def installed_torch() -> str | None:
    """The version of the torch installed for this Python, read from its metadata (torch is not imported); None if none."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def torch_row(version: str | None) -> tuple[str, str, str]:
    """Doctor's row for torch: installed, and new enough for the course (2.4)."""
    if version is None:
        return ("fail", "torch", "not installed: `make start` installs it")
    too_old = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (2, 4)
    return ("fail" if too_old else "ok", "torch", version + (" (the course needs 2.4 or newer)" if too_old else ""))


def watch_servers(root) -> list[str]:
    """The allocator settings of the ready servers that can serve the course at ``root``: where no keeper runs (as
    :func:`kept_row` asks), `oomlab watch`'s."""
    import json

    from oomlab.measure.warm import WarmServer, info_path

    found = []
    for info in sorted(info_path(Path(root).resolve(), "").parent.glob("*.json")):
        try:
            conf = json.loads(info.read_text(encoding="utf-8"))["alloc_conf"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if WarmServer.find(root, conf) is not None:
            found.append(conf)
    return found


def kept_row(root) -> tuple[str, str, str] | None:
    """Whether a measuring server is kept warm for the course: a process a check or a run left in the background
    (None on a machine without a GPU, where none runs and none would start)."""
    from oomlab.measure.keeper import IDLE_S, kept

    servers = kept(root)
    if not servers:
        if watched := watch_servers(root):
            settings = ", ".join(conf or "default" for conf in watched)
            return ("ok", "warm server", f"`oomlab watch`'s (allocator settings {settings}): checks and runs fork from it")
        if not has_nvidia_driver():
            return None
        return ("ok", "warm server", "none: the next check or run starts a fresh Python, which imports torch first")
    said = []
    for server in servers:
        settings = server["alloc_conf"]
        what = "starting (importing torch)" if settings is None else f"allocator settings {settings or 'default'}"
        if server["idle_s"] is not None:
            what += f", idle {server['idle_s'] / 60:.0f} of {IDLE_S / 60:g} minutes"
        said.append(what)
    return ("ok", "warm server", f"kept for this course by a check or run ({'; '.join(said)}): `oomlab stop` ends it")


def diagnose() -> tuple[list[tuple[str, str, str]], bool]:
    """Rows of (level, item, finding), level in ok/warn/fail; and whether measuring can work."""
    rows: list[tuple[str, str, str]] = []
    ok = sys.version_info >= (3, 10)
    rows.append(("ok" if ok else "fail", "Python", f"{platform.python_version()} ({sys.executable})"))
    rows.append(sandbox_row())

    exercises = []
    try:
        from oomlab.course import Course

        course = Course(strict=False)
        exercises = course.exercises
        if course.broken:
            rows.append(
                (
                    "ok",
                    "course",
                    f"{course.root}: {len(exercises)} exercises load, {len(course.broken)} {'does' if len(course.broken) == 1 else 'do'} not",
                )
            )
            ok = False
            rows.extend(("fail", f"exercise {ex_id}", course.problem(ex_id)) for ex_id in course.broken)
        else:
            rows.append(("ok", "course", f"{course.root}: {len(exercises)} exercises, every manifest valid"))
        if row := kept_row(course.root):
            rows.append(row)
    except OomLabError as err:
        rows.append(("fail", "course", str(err)))

    driver = has_nvidia_driver()
    if not driver:  # nothing can be measured here: say so without the seconds importing torch takes
        rows.append(torch_row(installed_torch()))
        rows.append(("fail", "GPU", "no NVIDIA GPU on this machine: no NVIDIA driver"))
        return rows, False
    try:
        import torch
    except ImportError:
        rows.append(torch_row(None))
        return rows, False
    rows.append(row := torch_row(torch.__version__))
    too_old = row[0] == "fail"
    if torch.version.cuda is None:
        rows.append(
            (
                "fail",
                "CUDA",
                "this torch is a CPU-only build, and this machine has an NVIDIA driver: install a CUDA build of torch",
            )
        )
        return rows, False
    if not torch.cuda.is_available():
        rows.append(
            ("fail", "GPU", f"torch is built for CUDA {torch.version.cuda} but sees no GPU (driver, CUDA_VISIBLE_DEVICES?)")
        )
        return rows, False
    try:
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
    except (RuntimeError, AssertionError) as err:  # a GPU in a bad state, or hidden after torch started
        rows.append(("fail", "GPU", f"torch sees a GPU but cannot query it: {err} (nvidia-smi shows its state)"))
        return rows, False
    rows.append(("ok", "GPU", f"{props.name}: {total / GIB:.1f} GiB, {free / GIB:.1f} GiB free, CUDA {torch.version.cuda}"))
    rows.append(witness_row())
    rows.append(distributed_row(torch))

    ready = not too_old and ok  # ok: Python new enough, every manifest valid
    for ex in exercises:
        if ex.is_estimate:  # the learner's estimate runs on the CPU; the course's own runs of its configs on the GPU
            rows.append(("ok", f"estimate {ex.id}", "no budget: its hidden configs are measured one at a time on this GPU"))
            continue
        if total < ex.budget_bytes:
            level, finding = "fail", f"needs {in_gib(ex.budget_bytes)}; the GPU has {in_gib(total)}"
        elif free < ex.budget_bytes:
            level, finding = (
                "fail",
                f"needs {in_gib(ex.budget_bytes)} free; only {in_gib(free)} is (nvidia-smi shows who holds it)",
            )
        elif free < ex.budget_bytes + CONTEXT_BYTES:
            level, finding = (
                "warn",
                f"the {in_gib(ex.budget_bytes)} budget fits in the {in_gib(free)} free, but the CUDA context "
                f"takes up to {CONTEXT_BYTES / GIB:.0f} GiB more outside it: the run may fail before it starts",
            )
        else:
            level, finding = "ok", f"budget {in_gib(ex.budget_bytes)} fits, with room for the CUDA context"
        ready &= level != "fail"
        rows.append((level, f"budget {ex.id}", finding))

    for var in ALLOC_CONF_VARS:
        if value := os.environ.get(var):
            rows.append(
                (
                    "warn",
                    var,
                    f"set to {value!r} in your shell; oomlab runs each exercise with the settings in its exercise.toml instead",
                )
            )
    if not any(r[1].startswith("PYTORCH") for r in rows):
        rows.append(("ok", "allocator settings", "none set in your shell; each exercise uses the settings in its exercise.toml"))
    return rows, ready
