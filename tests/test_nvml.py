"""The driver's figure for this process (NVML) and what of it lies outside the caching allocator.

A fake ``pynvml`` stands in for the driver: devices, each with the compute
processes NVML lists on it, as ``nvmlDeviceGetComputeRunningProcesses``
returns them (``pid``, ``usedGpuMemory`` in bytes, None where NVML has no figure).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from oomlab.measure import nvml
from oomlab.units import MIB

REPO = Path(__file__).resolve().parents[1]
PID = 4242


class FakeNVMLError(Exception):
    pass


def fake_pynvml(devices: list[list[tuple[int, int | None]]], fail: str = "", names_as_bytes: bool = False):
    """``devices``: per GPU, the (pid, used bytes) NVML lists. ``fail`` names a call that raises."""
    calls: list[str] = []

    def call(name, result=None):
        def fn(*args):
            calls.append(name)
            if name == fail:
                raise FakeNVMLError(f"{name}: Not Supported")
            return result(*args) if callable(result) else result

        return fn

    def text(value: str):
        return value.encode() if names_as_bytes else value

    module = types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlInit=call("nvmlInit"),
        nvmlShutdown=call("nvmlShutdown"),
        nvmlDeviceGetCount=call("nvmlDeviceGetCount", len(devices)),
        nvmlDeviceGetHandleByIndex=call("nvmlDeviceGetHandleByIndex", lambda i: i),
        nvmlDeviceGetComputeRunningProcesses=call(
            "nvmlDeviceGetComputeRunningProcesses",
            lambda i: [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in devices[i]],
        ),
        nvmlDeviceGetName=call("nvmlDeviceGetName", lambda i: text("NVIDIA H200")),
        nvmlDeviceGetUUID=call("nvmlDeviceGetUUID", lambda i: text(f"GPU-0000000{i}")),
    )
    return module, calls


# --------------------------------------------------------------------------- asking the driver


def test_this_process_is_found_by_its_id_on_every_gpu_it_uses():
    module, calls = fake_pynvml([[(17, 900 * MIB), (PID, 1154 * MIB)], [(PID, 600 * MIB)], [(17, 3 * MIB)]], names_as_bytes=True)
    reading = nvml.read_process_memory(PID, module)
    assert reading["available"] and reading["pid"] == PID
    assert reading["used_bytes"] == 1754 * MIB
    assert reading["devices"] == [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000", "used_bytes": 1154 * MIB},
        {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-00000001", "used_bytes": 600 * MIB},
    ]
    assert calls[0] == "nvmlInit" and calls[-1] == "nvmlShutdown"


def test_a_container_hiding_process_ids_gives_no_figure_rather_than_a_guess():
    module, _ = fake_pynvml([[(90817, 1154 * MIB)]])  # the host's id for this very process
    reading = nvml.read_process_memory(PID, module)
    assert not reading["available"] and "used_bytes" not in reading
    assert "1 process on the GPU, none with this process's id (4242)" in reading["reason"]
    assert "container" in reading["reason"]
    module, _ = fake_pynvml([[]])
    assert "lists no process" in nvml.read_process_memory(PID, module)["reason"]


def test_a_driver_without_per_process_figures_says_so():
    module, _ = fake_pynvml([[(PID, None)]])
    reading = nvml.read_process_memory(PID, module)
    assert not reading["available"] and "does not say how much memory" in reading["reason"]
    # one GPU without a figure spoils the sum over all: none rather than too little
    module, _ = fake_pynvml([[(PID, 900 * MIB)], [(PID, None)]])
    assert not nvml.read_process_memory(PID, module)["available"]


def test_nvml_failures_become_reasons_and_nvml_is_shut_down():
    module, calls = fake_pynvml([[(PID, MIB)]], fail="nvmlDeviceGetComputeRunningProcesses")
    reading = nvml.read_process_memory(PID, module)
    assert reading == {
        "available": False,
        "reason": "NVML failed: FakeNVMLError: nvmlDeviceGetComputeRunningProcesses: Not Supported",
    }
    assert calls[-1] == "nvmlShutdown"
    module, calls = fake_pynvml([[(PID, MIB)]], fail="nvmlInit")
    reading = nvml.read_process_memory(PID, module)
    assert reading["reason"].startswith("NVML could not start: FakeNVMLError") and "nvmlShutdown" not in calls


def test_without_pynvml_it_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    reading = nvml.read_process_memory()
    assert reading == {"available": False, "reason": "NVML's Python bindings are not installed (pip install nvidia-ml-py)"}


def test_it_asks_for_this_process_by_default(monkeypatch):
    import os

    module, _ = fake_pynvml([[(os.getpid(), 700 * MIB)]])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert nvml.read_process_memory()["used_bytes"] == 700 * MIB


# --------------------------------------------------------------------------- naming the difference


def reading(*used: int) -> dict:
    devices = [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "used_bytes": u} for i, u in enumerate(used)]
    return {"available": True, "pid": PID, "used_bytes": sum(used), "devices": devices}


def test_the_context_measured_at_the_start_and_the_rest():
    start = {"reading": reading(520 * MIB), "reserved": 0}
    out = nvml.outside_allocator(reading(1842 * MIB), 1100 * MIB, start)
    assert (out["used"], out["reserved"], out["outside"]) == (1842 * MIB, 1100 * MIB, 742 * MIB)
    assert (out["context"], out["context_source"], out["rest"]) == (520 * MIB, "start", 222 * MIB)
    assert out["summary"] == (
        "The driver says this process uses 1,842.0 MiB; the allocator reserved 1,100.0 MiB; outside the allocator "
        "742.0 MiB (the CUDA context about 520.0 MiB, measured in this process when the script began; the rest, "
        "222.0 MiB: kernels loaded as they are first used, and other allocators (NCCL, cuBLAS and cuDNN handles, a "
        "second library's own cudaMalloc)). cuBLAS and cuDNN workspaces are not part of it: torch allocates them from "
        "its own cache, so they are inside reserved."
    )
    json.dumps(out)


def test_reserved_at_the_start_is_not_counted_as_context():
    out = nvml.outside_allocator(reading(1000 * MIB), 400 * MIB, {"reading": reading(600 * MIB), "reserved": 100 * MIB})
    assert out["context"] == 500 * MIB and out["rest"] == 100 * MIB


def test_a_second_gpu_used_later_brings_its_own_context():
    out = nvml.outside_allocator(reading(1200 * MIB, 800 * MIB), 900 * MIB, {"reading": reading(500 * MIB), "reserved": 0})
    assert out["devices"] == 2 and out["rest"] == 600 * MIB
    assert "the rest, 600.0 MiB: the CUDA contexts of 1 more GPU, kernels loaded" in out["summary"]


def test_without_a_start_figure_the_reference_context_is_named_as_such():
    out = nvml.outside_allocator(reading(2000 * MIB), 1000 * MIB, None)
    assert out["context_source"] == "reference" and out["context"] == nvml.REFERENCE_CONTEXT_BYTES
    assert out["rest"] == 1000 * MIB - nvml.REFERENCE_CONTEXT_BYTES
    assert (
        "(the CUDA context about 742.0 MiB, measured after a few training steps on an H200 by `oomlab dev facts`"
        in out["summary"]
    )
    assert "the rest, about 258.0 MiB: other allocators" in out["summary"]
    # no more outside than a context holds: nothing is put down to other allocators
    small = nvml.outside_allocator(
        reading(1500 * MIB), 1000 * MIB, {"reading": {"available": False, "reason": "x"}, "reserved": 0}
    )
    assert small["context_source"] == "reference" and "no more than the CUDA context holds" in small["summary"]
    assert "other allocators" not in small["summary"]
    two = nvml.outside_allocator(reading(1000 * MIB, 1000 * MIB), 100 * MIB)
    assert two["context"] == 2 * nvml.REFERENCE_CONTEXT_BYTES and "on each of 2 GPUs" in two["summary"]


def test_a_driver_figure_below_reserved_names_no_parts():
    out = nvml.outside_allocator(reading(900 * MIB), 1000 * MIB, None)
    assert out["outside"] == -100 * MIB and out["context"] is None
    assert out["summary"].endswith("the driver counts 100.0 MiB less, so nothing outside the allocator shows.")


def test_no_figure_says_why():
    out = nvml.outside_allocator(
        {"available": False, "reason": "NVML's Python bindings are not installed (pip install nvidia-ml-py)"}, 10
    )
    assert not out["available"]
    assert out["summary"] == (
        "The driver's figure for this process (NVML) is unavailable: NVML's Python bindings are not installed "
        "(pip install nvidia-ml-py)."
    )


# --------------------------------------------------------------------------- the figures it quotes


def facts() -> dict:
    path = REPO / "course" / "measurements" / "facts.json"
    if not path.is_file():
        pytest.skip("facts.json is not in this checkout")
    return json.loads(path.read_text(encoding="utf-8"))["facts"]


def test_the_reference_context_is_the_measured_one():
    measured = facts().get("cuda_context")
    if not measured or measured.get("non_pytorch_bytes") is None:
        pytest.skip("oomlab dev facts has not measured the CUDA context")
    assert measured["non_pytorch_bytes"] == nvml.REFERENCE_CONTEXT_BYTES, "update REFERENCE_CONTEXT_BYTES to facts.json"


def test_cublas_workspaces_are_counted_by_the_allocator_as_the_report_says():
    measured = facts().get("cublas_workspace")
    if not measured:
        pytest.skip("oomlab dev facts has not measured the cuBLAS workspaces")
    # memory_allocated() grew by them, and clearing them gave the same bytes back: the allocator holds them
    assert measured["first_matmul_bytes"] > 0 and measured["cleared_bytes"] == measured["both_bytes"]
    assert "inside reserved" in nvml.INSIDE


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_the_real_driver_counts_more_than_the_allocator():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    import torch

    block = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    got = nvml.read_process_memory()
    if not got["available"] and "container" in got["reason"]:
        pytest.skip(got["reason"])
    assert got["available"], got["reason"]
    out = nvml.outside_allocator(got, torch.cuda.memory_reserved())
    assert out["used"] >= torch.cuda.memory_reserved() >= block.numel()
    assert out["outside"] > 100 * MIB, "a CUDA context costs hundreds of MiB"
