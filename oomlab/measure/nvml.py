"""What the driver says this process holds on the GPU, and what of it the caching allocator does not count.

``torch.cuda.memory_reserved()`` counts only the segments PyTorch's caching
allocator took with ``cudaMalloc``. The driver counts everything the process
holds on the device, the figure ``nvidia-smi`` shows and an OOM message quotes
as *Including non-PyTorch memory, this process has ...*. The difference is
memory outside the allocator:

- the **CUDA context**: the driver's own state for the process on that
  device, and the kernels' code, loaded as each kernel is first used
  (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7), so it grows
  as a run meets new operators. ``oomlab dev facts`` measures it after a few
  training steps (``cuda_context`` in ``course/measurements/facts.json``, and
  :data:`REFERENCE_CONTEXT_BYTES`, which the tests keep equal to it);
- **other allocators**: memory a library takes with its own ``cudaMalloc``:
  NCCL's communication buffers, the small device state of cuBLAS and cuDNN
  handles, and a second framework (CuPy, JAX, TensorRT) with its own pool.

What is *not* in the difference: the cuBLAS workspaces. PyTorch allocates them
through its caching allocator (one per handle and stream, and backward adds a
handle of its own: ``cublas_workspace`` in ``facts.json``), so they are inside
reserved, and allocated;
``torch._C._cuda_clearCublasWorkspaces()`` gives them back. cuDNN's workspaces
come from the caching allocator too.

:func:`read_process_memory` asks the driver through NVML (the ``pynvml``
module of the ``nvidia-ml-py`` package, which the witness needs too) and
:func:`outside_allocator` names the difference; it is pure, and the tests
drive both with a fake ``pynvml``.

NVML names processes by their id, matched here with :func:`os.getpid`. In a
container without the host's process namespace, NVML reports the host's ids,
which match nothing inside: the reading then says so and gives no figure,
rather than guessing which of the listed processes is this one.

Standard library only at import: the snapshot probe reads the driver inside
the measured process, and ``pynvml`` is imported only when asked.
"""

from __future__ import annotations

import contextlib
import os

from oomlab.units import format_bytes

__all__ = ["REFERENCE_CONTEXT", "REFERENCE_CONTEXT_BYTES", "memory_by_process", "outside_allocator", "read_process_memory"]

# `oomlab dev facts`, probe cuda_context (non_pytorch_bytes): what a process held beyond the allocator's
# segments after a few training steps on an H200, torch 2.11, CUDA 13.0. tests/test_nvml.py keeps it in step.
REFERENCE_CONTEXT_BYTES = 778_043_392
REFERENCE_CONTEXT = "measured after a few training steps on an H200 by `oomlab dev facts`"

INSTALL = "pip install nvidia-ml-py"
OTHERS = "other allocators (NCCL, cuBLAS and cuDNN handles, a second library's own cudaMalloc)"
GROWN_BY = f"kernels loaded as they are first used, and {OTHERS}"
INSIDE = "cuBLAS and cuDNN workspaces are not part of it: torch allocates them from its own cache, so they are inside reserved."


def unavailable(reason: str) -> dict:
    """A reading that has no figure, and says why."""
    return {"available": False, "reason": reason}


def read_process_memory(pid: int | None = None, nvml=None) -> dict:
    """What the driver counts for process ``pid`` (default: this one) on every GPU it uses.

    Returns ``{"available": True, "used_bytes", "devices": [{"index", "name",
    "uuid", "used_bytes"}], "pid"}``, or ``{"available": False, "reason"}``
    saying why there is no figure: ``pynvml`` missing, NVML failing, the
    process not listed (a container hiding process ids, or no CUDA context
    yet), or a driver that does not report per-process memory. Never raises.

    ``nvml`` is the ``pynvml`` module to ask (tests hand in a fake).
    """
    pid = os.getpid() if pid is None else pid
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return unavailable(f"NVML's Python bindings are not installed ({INSTALL})")
    try:
        nvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError, or a library that cannot be loaded
        return unavailable(f"NVML could not start: {_said(err)}")
    try:
        return _listed_memory(nvml, pid)
    except Exception as err:  # noqa: BLE001 - a query this driver does not support, a device gone
        return unavailable(f"NVML failed: {_said(err)}")
    finally:
        with contextlib.suppress(Exception):  # NVML counts its inits: a script's own use of it is left as it was
            nvml.nvmlShutdown()


def memory_by_process(nvml, *handles) -> dict[int, int | None]:
    """pid -> the bytes the driver counts for it on the GPUs of ``handles``, summed over them, NVML started.

    None where the driver lists the process but not its memory (NVML_VALUE_NOT_AVAILABLE:
    MIG without privileges, WDDM); a process listed more than once is summed. The one
    reading of NVML's process list, for :func:`read_process_memory` (one GPU at a time)
    and the witness (all of them).
    """
    used: dict[int, int | None] = {}
    for handle in handles:
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            before = used.get(p.pid, 0)
            used[p.pid] = None if before is None or p.usedGpuMemory is None else before + int(p.usedGpuMemory)
    return used


def _listed_memory(nvml, pid: int) -> dict:
    """The reading from NVML's process lists, NVML started."""
    devices, listed, hidden = [], 0, 0
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        processes = memory_by_process(nvml, handle)
        listed += len(processes)
        if pid not in processes:
            continue
        if processes[pid] is None:
            hidden += 1
            continue
        devices.append(
            {
                "index": index,
                "name": _text(nvml.nvmlDeviceGetName(handle)),
                "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                "used_bytes": processes[pid],
            }
        )
    if hidden:  # even beside figures from other GPUs: a sum that leaves one out would mislead
        return unavailable("the driver lists this process but does not say how much memory it uses (MIG, or no permission)")
    if devices:
        return {"available": True, "pid": pid, "used_bytes": sum(d["used_bytes"] for d in devices), "devices": devices}
    if listed:
        return unavailable(
            f"the driver lists {listed} process{'es' if listed != 1 else ''} on the GPU, none with this process's id "
            f"({pid}): in a container the driver names processes by the host's ids, so there is no figure rather than a guess"
        )
    return unavailable(
        "the driver lists no process on the GPU: the process has no CUDA context yet, or a container hides the processes from it"
    )


def _text(value) -> str:
    """NVML strings are ``bytes`` in older bindings, ``str`` in newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _said(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def outside_allocator(reading: dict, reserved: int, start: dict | None = None) -> dict:
    """Name what the driver counts beyond the allocator's reserved memory.

    Args:
        reading: :func:`read_process_memory` at the moment ``reserved`` was read.
        reserved: the bytes the caching allocator had reserved then, over every device.
        start: ``{"reading", "reserved"}`` read the same way when the script began, with the
            CUDA context made and nothing of the script's on the GPU; it measures this
            process's context. Without it the reference figure stands in, named as such.

    Returns ``available`` and, with a figure, ``used``, ``reserved``, ``outside``
    (used - reserved), ``context`` and ``context_source`` (``"start"``: measured
    in this process; ``"reference"``: :data:`REFERENCE_CONTEXT_BYTES` per GPU),
    ``rest`` (outside less the context: what other allocators, and kernels loaded
    since the start, hold) and ``summary``, the sentence the report shows;
    without a figure, ``reason`` and ``summary``.
    """
    if not reading.get("available"):
        reason = reading.get("reason") or "no reading"
        return {
            "available": False,
            "reason": reason,
            "summary": f"The driver's figure for this process (NVML) is unavailable: {reason}.",
        }
    used = int(reading["used_bytes"])
    outside = used - int(reserved)
    result = {
        "available": True,
        "used": used,
        "reserved": int(reserved),
        "outside": outside,
        "devices": len(reading.get("devices") or []) or 1,
        "context": None,
        "context_source": None,
        "rest": None,
        "inside": INSIDE,
    }
    head = f"The driver says this process uses {format_bytes(used)}; the allocator reserved {format_bytes(reserved)}"
    if outside < 0:
        # The allocator's figure and the driver's were read a moment apart, or the driver rounds: no parts to name.
        result["summary"] = f"{head}: the driver counts {format_bytes(-outside)} less, so nothing outside the allocator shows."
        return result
    start_outside = _outside_at(start)
    if start_outside is not None:
        context, source, where = start_outside, "start", "measured in this process when the script began"
    else:
        # One context per GPU the process uses; the reference was measured with one.
        context, source = REFERENCE_CONTEXT_BYTES * result["devices"], "reference"
        where = REFERENCE_CONTEXT + (f", on each of {result['devices']} GPUs" if result["devices"] > 1 else "")
    rest = outside - context
    result.update(context=context, context_source=source, rest=rest)
    if source == "start":
        parts = f"the CUDA context about {format_bytes(context)}, {where}"
        more_gpus = result["devices"] - len(start["reading"].get("devices") or []) if start else 0
        grown_by = (
            f"the CUDA contexts of {more_gpus} more GPU{'s' if more_gpus > 1 else ''}, " if more_gpus > 0 else ""
        ) + GROWN_BY
        if rest > 0:
            parts += f"; the rest, {format_bytes(rest)}: {grown_by}"
    elif rest > 0:
        parts = f"the CUDA context about {format_bytes(context)}, {where}, kernels included; the rest, about {format_bytes(rest)}: {OTHERS}"
    else:
        parts = f"no more than the CUDA context holds: about {format_bytes(context)}, {where}, kernels included"
    result["summary"] = f"{head}; outside the allocator {format_bytes(outside)} ({parts}). {INSIDE}"
    return result


def _outside_at(start: dict | None) -> int | None:
    """The driver's figure less reserved at the script's start, when both were read and make sense."""
    if not start or not (start.get("reading") or {}).get("available") or start.get("reserved") is None:
        return None
    outside = int(start["reading"]["used_bytes"]) - int(start["reserved"])
    return outside if outside > 0 else None
