"""Held-out torchrun job: one rank skips a batch that ran out of memory, and the ranks' collectives fall out of step.

Two data-parallel ranks average their gradients with all_reduce, one call per
parameter. Rank 1's shard has one batch far larger than the others; it runs out
of memory in that step, and the loop catches the error and moves on to the next
batch, as many training loops do. Rank 1 then makes four all_reduce calls fewer
than rank 0: its next step's calls pair up with rank 0's current ones, so the
job goes on silently, until rank 1 finishes and rank 0's last calls find no peer.
Expected: the job is desynchronised (the all_reduce counts differ), and the
rank that failed, rank 0, is not the one to fix.
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
skipped = 0

for step in range(20):
    rows = 2048 * 64 if (rank == 1 and step == 5) else 2048  # one outsized batch in rank 1's shard
    try:
        out = model(torch.randn(rows, 1024, device=device))
        loss = out.pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    except torch.cuda.OutOfMemoryError:
        skipped += 1
        optimizer.zero_grad(set_to_none=True)
        continue  # skip the batch: this rank's all_reduce calls for the step are skipped with it
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()

print(f"rank {rank}: skipped {skipped} batch(es)")
dist.destroy_process_group()
