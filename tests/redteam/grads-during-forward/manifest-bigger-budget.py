"""Train a deep, wide residual MLP classifier with AdamW.

The model is large and the batch is modest, so most of the memory is the model's
own: weights, and what training adds to them. The first step runs; the second
dies with CUDA out of memory in the middle of the forward pass, on a layer that
is no bigger than it was a step earlier. Work out what is on the GPU at that
moment and which of it need not be, and fix the script so that it fits, without
changing what it trains.

RED TEAM (class 1, a line the grader never reads: the learner's own
exercise.toml). Attacks: the budget and the tolerance. This script is the
seeded bug, unchanged; the learner's copy of exercise.toml raises the budget
to 8 GiB and the peak_allocated tolerance to 30%. The bug needs about 5.8 GiB,
1.19 times the reference's peak: a grader that reads the learner's manifest
sees no OOM and a peak within tolerance.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_layers, n_classes = 1024, 4096, 18, 100
batch_size, steps = 2048, 20

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


def get_batch(gen):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


class ResidualBlock(nn.Module):
    """x + W·gelu(norm(x)): the skip path keeps a deep stack trainable from the first step."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(d_hidden)
        self.fc = nn.Linear(d_hidden, d_hidden)

    def forward(self, x):
        return x + self.fc(F.gelu(self.norm(x)))


model = nn.Sequential(
    nn.Linear(d_in, d_hidden),
    *(ResidualBlock() for _ in range(n_layers - 2)),
    nn.LayerNorm(d_hidden),
    nn.Linear(d_hidden, n_classes),
).to(device)
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params / 1e6:.1f}M parameters, {n_params * 4 / 2**20:.0f} MiB of fp32 weights")
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.1, fused=True)

gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(gen)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step == 1 or step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
