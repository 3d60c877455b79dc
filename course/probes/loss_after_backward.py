"""What keeping a loss tensor costs on the GPU, depending on whether ``backward()`` ran through its graph.

The same small training loop (an MLP, AdamW) runs three times in this process, each
from an empty cache, and differs only in what it keeps from every step:

- ``item``: ``loss.item()``, a Python float;
- ``tensor_after_backward``: the loss tensor, appended after ``loss.backward()``;
- ``eval_graph``: besides training, one forward pass per step with autograd on (as an
  evaluation loop without ``torch.no_grad()``), whose loss is kept and never backpropagated.

For each: the peak of allocated memory over the loop, and what the kept list held at
the end (what clearing it freed).

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import gc
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

# PYTORCH_CUDA_ALLOC_CONF for this probe: the defaults.
ALLOC_CONF = ""

STEPS, BATCH, D_IN, D_HIDDEN, CLASSES = 10, 512, 1024, 2048, 10


def allocated() -> int:
    return torch.cuda.memory_allocated()


def loop(keep: str, x: torch.Tensor, y: torch.Tensor) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(D_IN, D_HIDDEN), nn.GELU(), nn.Linear(D_HIDDEN, D_HIDDEN), nn.GELU(), nn.Linear(D_HIDDEN, CLASSES)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    kept: list = []
    for _ in range(STEPS):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if keep == "item":
            kept.append(loss.item())
        elif keep == "tensor_after_backward":
            kept.append(loss)
        elif keep == "eval_graph":
            kept.append(F.cross_entropy(model(x), y))
        del loss
    torch.cuda.synchronize()
    peak, end = torch.cuda.max_memory_allocated(), allocated()
    kept.clear()
    gc.collect()
    kept_bytes = end - allocated()
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return {"peak_allocated_bytes": peak, "kept_bytes": kept_bytes, "kept_per_step_bytes": kept_bytes // STEPS}


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(BATCH, D_IN, device="cuda", generator=gen)
    y = torch.randint(CLASSES, (BATCH,), device="cuda", generator=gen)
    loop("nothing", x, y)  # warm-up: the libraries' workspaces are allocated once, here, for every loop below
    facts = {"steps": STEPS, **{keep: loop(keep, x, y) for keep in ("item", "tensor_after_backward", "eval_graph")}}
    for keep in ("tensor_after_backward", "eval_graph"):
        facts[keep]["extra_peak_bytes"] = facts[keep]["peak_allocated_bytes"] - facts["item"]["peak_allocated_bytes"]
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
