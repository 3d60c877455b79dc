"""Held-out leak: batches that fail a sanity check are skipped, and their exceptions kept for a report.

The forward pass raises when the activations blow up; the loop skips that
batch and keeps the exception to list at the end. Each exception keeps its
traceback, the traceback keeps checked_forward()'s frame, and the frame keeps
that batch's activations and the graph they carry. Expected holder:
skipped[i][1].__traceback__.tb_next -> checked_forward() frame.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 8192, 100
batch_size, steps, limit = 4096, 40, 1e3


def checked_forward(model, x):
    h = model[1](model[0](x))
    if h.abs().max() > limit:
        raise ValueError(f"activations blew up (max {h.abs().max().item():.3g})")
    return model[2](h)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, n_classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
gen = torch.Generator(device=device).manual_seed(0)
skipped = []
for step in range(1, steps + 1):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    if step % 2 == 0:
        x = x * 1e4  # a corrupt batch: every other one, for the test
    y = torch.randint(n_classes, (batch_size,), device=device, generator=gen)
    try:
        logits = checked_forward(model, x)
    except ValueError as err:
        skipped.append((step, err))
        continue
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
print(f"skipped {len(skipped)} batches")
