"""Held-out torchrun job: two data-parallel ranks, and only rank 0 keeps every step's output for a log at the end.

Both ranks train the same MLP and average their gradients with all_reduce. Rank 0
appends each step's output to a list (backward has freed what its graph saved; the
output itself, 8 MiB, stays); rank 1 keeps nothing. Rank 0 runs out of memory some
steps in; rank 1 then waits for it in its next all_reduce, which fails when rank 0's
process is gone. Expected: rank 0 failed first, its hunt blames `outputs`, the ranks'
peaks differ, and the one all_reduce rank 1 had in flight does not make the job
desynchronised.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")  # gloo: two ranks can share one GPU
rank, world = dist.get_rank(), dist.get_world_size()
device = "cuda"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
outputs = []

for _ in range(40):
    x = torch.randn(2048, 1024, device=device)
    out = model(x)
    loss = out.pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    if rank == 0:
        outputs.append(out)  # for the log: the output, kept on the GPU

if rank == 0:
    print("mean output", torch.stack([o.mean() for o in outputs]).mean().item())
dist.destroy_process_group()
