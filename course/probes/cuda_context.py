"""What a measuring process holds on the GPU outside PyTorch's allocator, on top of its budget.

The process caps the allocator as an exercise does (``set_per_process_memory_fraction``,
here to 1 GiB), runs a few training steps of a small language model (embedding, linear
layers, GELU, one-hot, log-softmax, cross-entropy, AdamW: the kernels the exercises load),
and then compares what the driver counts for this process with what the allocator reserved.

The driver's count comes, in this order of preference, from NVML per process
(``nvidia-ml-py``, the same figure as the ``Including non-PyTorch memory, this process
has ...`` part of an OOM message) or from ``nvidia-smi --query-compute-apps``;
``method`` says which. The probe then provokes an out-of-memory error under the cap and
reads that part of PyTorch's own message as a second reading (``oom_message_*``).

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import json
import os
import re
import shutil
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F

# PYTORCH_CUDA_ALLOC_CONF for this probe: the defaults.
ALLOC_CONF = ""

BUDGET = 1 << 30
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def nvml_used(pid: int) -> int | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        used = None
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    used = (used or 0) + proc.usedGpuMemory
        return used
    except Exception:
        return None


def smi_used(pid: int) -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used = [int(line.split(",")[1]) << 20 for line in out.splitlines() if line.split(",")[0].strip() == str(pid)]
    return sum(used) if used else None


def train(steps: int = 3) -> None:
    vocab, d_model, batch, seq = 8192, 256, 4, 256
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(vocab, d_model), nn.Linear(d_model, d_model), nn.GELU(), nn.Linear(d_model, vocab)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        tokens = torch.randint(vocab, (batch, seq + 1), device="cuda")
        logits, targets = model(tokens[:, :-1]), tokens[:, 1:]
        one_hot_loss = -(F.one_hot(targets, vocab).float() * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
        loss = one_hot_loss + F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()


def main() -> None:
    pid = os.getpid()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(BUDGET / total, 0)
    train()
    reserved = torch.cuda.memory_reserved()
    used, method = nvml_used(pid), "nvml"
    if used is None:
        used, method = smi_used(pid), "nvidia-smi"
    if used is None:
        method = "none"
    facts = {
        "budget_bytes": BUDGET,
        "method": method,
        "reserved_bytes": reserved,
        "process_used_bytes": used,
        "non_pytorch_bytes": None if used is None else used - reserved,
    }

    message = ""
    try:
        torch.empty(2 * BUDGET, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as err:
        message = str(err)
    reserved_at_oom = torch.cuda.memory_reserved()
    m = re.search(r"this process has ([\d.]+) (B|KiB|MiB|GiB) memory in use", message)
    in_use = round(float(m.group(1)) * UNITS[m.group(2)]) if m else None
    facts.update(
        {
            "oom_message_process_used_bytes": in_use,
            "oom_message_reserved_bytes": reserved_at_oom,
            "oom_message_non_pytorch_bytes": None if in_use is None else in_use - reserved_at_oom,
        }
    )
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
