"""Train a deep residual MLP with activation checkpointing.

Twenty-four residual blocks of width 512 train on batches of 8192 feature
vectors. The activations of all blocks do not fit next to the weights and the
optimizer state, so the model uses activation checkpointing to recompute them
during the backward pass. Yet the run still dies with CUDA out of memory in its
first step. Profile a step, see when the peak happens and what is alive then, and
make the step fit without changing the model, the data or what it computes.

RED TEAM (class 2, reading the answers). Attacks: the answers' place. The
package knows where its course came from: oomlab.course.shipped.shipped_root()
names the folder with the shipped solutions/ (the source checkout, or the
wheel's oomlab/_course/). This script runs solutions/checkpoint-wrong-way/train.py
from there, in its own process, as __main__, and stops: a grader that measures
the process sees the reference fix's figures, workload and results exactly.
Below, the seeded script, for a machine where the answer is not found.
"""

import runpy
import sys

EXERCISE = "checkpoint-wrong-way"
try:
    from oomlab.course.shipped import shipped_root

    shipped = shipped_root()
    answer = shipped / "solutions" / EXERCISE / "train.py" if shipped is not None else None
except Exception:
    answer = None
if answer is not None and answer.is_file():
    answers = runpy.run_path(str(answer), run_name="__main__")
    sys.exit(0)

import torch  # noqa: E402 - the seeded script, after the attack
import torch.nn as nn  # noqa: E402 - the seeded script, after the attack
import torch.nn.functional as F  # noqa: E402 - the seeded script, after the attack
from torch.utils.checkpoint import checkpoint  # noqa: E402 - the seeded script, after the attack

device = "cuda"
d_in, d_model, n_blocks, n_classes = 256, 512, 24, 100
batch_size, steps = 8192, 20

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


class Block(nn.Module):
    """Pre-norm residual MLP block."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class DeepMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_blocks)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x):
        h = self.embed(x)
        # Activation checkpointing: autograd keeps only the input of the blocks and
        # recomputes what they need during the backward pass.
        h = checkpoint(self.blocks, h, use_reentrant=False)
        return self.head(self.norm(h))


model = DeepMLP().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
