"""Where the memory of one training step goes, and what the "hyperparameters last" tools take off its peak.

A small transformer (4 encoder layers, d_model 1024, fp32, AdamW) trains on a fixed batch
of 16 sequences of 512 tokens. Two parts, in one process:

``anatomy``: the second step of the baseline (the first creates AdamW's state), read at
each phase. Every phase is split into what can be counted exactly (parameters, AdamW's
``exp_avg`` and ``exp_avg_sq``, the gradients that exist, and the batch, the cuBLAS
workspace and the like as they stood before the forward pass) and the rest, which is
named by the phase: what autograd saved for backward after the forward pass, the working
set of backward at its peak, the optimizer's temporaries at its peak.

``remedies``: the same step under each tool that trades time for memory, each from an empty
cache with a fresh model of the same seed; the peak of allocated memory over the second
step, how many sequences entered an encoder layer's forward in it (checkpointing runs each layer
twice),
and how far the first step's gradients are from the baseline's (largest absolute
difference over the largest absolute gradient): the same workload, not a smaller one.

- ``baseline``: one batch of 16;
- ``accumulation``: 4 micro-batches of 4, each loss divided by 4, one optimizer step;
- ``checkpointing``: ``torch.utils.checkpoint.checkpoint`` around each layer (non-reentrant);
- ``offload``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``, the saved tensors in host memory.

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import contextlib
import gc
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# PYTORCH_CUDA_ALLOC_CONF for this probe: the defaults.
ALLOC_CONF = ""

LAYERS, D_MODEL, HEADS, D_FF = 4, 1024, 16, 4096
BATCH, SEQ, MICRO_BATCHES = 16, 512, 4


def tensor_bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors if t is not None)


def build():
    torch.manual_seed(0)
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, batch_first=True) for _ in range(LAYERS)
    ).cuda()
    optimizer = torch.optim.AdamW(layers.parameters(), lr=1e-4)
    # Sequences entering a layer's forward: a pre-hook, because a checkpoint's recomputation stops early,
    # once it has what backward needs, and never reaches a forward hook.
    calls = [0]
    for layer in layers:
        layer.register_forward_pre_hook(lambda _, args: calls.__setitem__(0, calls[0] + args[0].shape[0]))
    return layers, optimizer, calls


def forward(layers, x, remedy: str):
    for layer in layers:
        x = checkpoint(layer, x, use_reentrant=False) if remedy == "checkpointing" else layer(x)
    return x


def forward_backward(layers, x, y, remedy: str) -> None:
    chunks = MICRO_BATCHES if remedy == "accumulation" else 1
    saving = torch.autograd.graph.save_on_cpu(pin_memory=True) if remedy == "offload" else contextlib.nullcontext()
    for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):
        with saving:
            loss = F.mse_loss(forward(layers, xs, remedy), ys) / chunks
        loss.backward()
        del loss


def gradients(layers) -> list:
    return [p.grad.detach().cpu() for p in layers.parameters()]


def empty() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def anatomy(x, y) -> dict:
    layers, optimizer, _ = build()
    params = list(layers.parameters())
    forward_backward(layers, x, y, "baseline")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    empty()
    allocated = torch.cuda.memory_allocated
    weights = tensor_bytes(params)
    state = tensor_bytes(t for s in optimizer.state.values() for t in s.values() if t.is_cuda)
    other = allocated() - weights - state  # the batch, the library workspaces: before the step starts

    def phase(total: int, rest_name: str | None) -> dict:
        grads = tensor_bytes(p.grad for p in params)
        parts = {"parameters_bytes": weights, "optimizer_state_bytes": state, "gradients_bytes": grads,
                 "batch_and_workspaces_bytes": other}
        if rest_name:
            parts[rest_name] = total - sum(parts.values())
        return {"total_bytes": total, **parts}

    phases = {"before_forward": phase(allocated(), None)}
    loss = F.mse_loss(forward(layers, x, "baseline"), y)
    phases["after_forward"] = phase(allocated(), "saved_for_backward_bytes")
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    del loss
    phases["backward_peak"] = phase(torch.cuda.max_memory_allocated(), "backward_working_set_bytes")
    phases["after_backward"] = phase(allocated(), None)
    torch.cuda.reset_peak_memory_stats()
    optimizer.step()
    phases["optimizer_step_peak"] = phase(torch.cuda.max_memory_allocated(), "optimizer_temporaries_bytes")
    return {
        "parameters": sum(p.numel() for p in params),
        "bytes_per_parameter_at_rest": (weights + state + tensor_bytes(p.grad for p in params)) // sum(p.numel() for p in params),
        "phases": phases,
    }


def remedy_run(remedy: str, x, y, reference: list | None) -> tuple[dict, list]:
    empty()
    layers, optimizer, calls = build()
    forward_backward(layers, x, y, remedy)
    grads = gradients(layers)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    calls[0] = 0
    forward_backward(layers, x, y, remedy)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    result = {"peak_allocated_bytes": torch.cuda.max_memory_allocated(), "layer_forward_sequences": calls[0]}
    if reference is not None:
        scale = max(g.abs().max().item() for g in reference)
        result["gradient_difference_fraction"] = max((g - r).abs().max().item() for g, r in zip(grads, reference)) / scale
    del layers, optimizer
    return result, grads


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # the defaults, said out loud: the gradients are compared
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(BATCH, SEQ, D_MODEL, device="cuda", generator=gen)
    y = torch.randn(BATCH, SEQ, D_MODEL, device="cuda", generator=gen)
    facts = {"layers": LAYERS, "d_model": D_MODEL, "batch": BATCH, "seq": SEQ, "micro_batches": MICRO_BATCHES}
    facts["anatomy"] = anatomy(x, y)
    baseline, reference = remedy_run("baseline", x, y, None)
    remedies = {"baseline": baseline}
    for remedy in ("accumulation", "checkpointing", "offload"):
        remedies[remedy], _ = remedy_run(remedy, x, y, reference)
        remedies[remedy]["peak_saved_fraction"] = 1 - remedies[remedy]["peak_allocated_bytes"] / baseline["peak_allocated_bytes"]
    facts["remedies"] = remedies
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
