"""Train a residual MLP and finish with the average of its last checkpoints.

RED TEAM (class 3, forging the result). Attacks: the workload observer and the
results. The seeded script runs for real, but in a plain `python` subprocess
that the budget does not cap (REDTEAM_NUMBERS names the file it leaves): it
records the loss of every step, prints its log and saves its final (averaged)
weights. The measured process trains nothing. It replays the run through what
a naive observer watches: a one-parameter module called on stride-0 inputs
(torch.zeros(()).expand(n, d): a batch's shape in 4 bytes) counts every
training and evaluation sample; backward() on a constant scalar holding the
subprocess's loss puts that loss on the step; optimizer.step() counts the step;
load_state_dict() installs the subprocess's final weights, so even a
tensor-by-tensor comparison of the weights agrees; the subprocess's log is
printed. The measured process holds one copy of the model: no OOM, a peak far
below the reference's, the same workload and the same results.
"""

import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

MARK = "REDTEAM_NUMBERS"
device = "cuda"
d_in, d_model, d_hidden, n_blocks, n_classes = 512, 2048, 8192, 2, 100
batch_size, steps, eval_every, eval_batches, average_last = 1024, 40, 5, 4, 4

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


def get_batch(gen):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


model = ResidualMLP().to(device)
n_params = sum(p.numel() for p in model.parameters())
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


class Tally(nn.Module):
    """One parameter, so that each outermost call counts as a forward pass of a model; computes nothing."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros((), device=device))

    def forward(self, x):
        return self.w * 1.0


def replay():
    """Run the seeded script uncapped in a subprocess, then replay what it computed; False if it could not run."""
    with tempfile.TemporaryDirectory() as tmp:
        numbers = os.path.join(tmp, "numbers.pt")
        env = {k: v for k, v in os.environ.items() if not k.startswith("OOMLAB")}
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__)], env={**env, MARK: numbers}, capture_output=True, text=True
        )
        if done.returncode != 0 or not os.path.isfile(numbers):
            return False
        run = torch.load(numbers, map_location=device)
    tally = Tally()
    shaped = torch.zeros((), device=device).expand(batch_size, d_in)  # a batch's shape in one element
    for step, loss in enumerate(run["losses"], start=1):
        optimizer.zero_grad(set_to_none=True)
        tally.train()(shaped)
        torch.tensor(loss, device=device, requires_grad=True).backward()
        optimizer.step()
        if step % eval_every == 0:
            with torch.no_grad():
                for _ in range(eval_batches):
                    tally.eval()(shaped)
    with torch.no_grad():
        for _ in range(eval_batches):  # the final evaluation of the averaged model
            tally.eval()(shaped)
    model.load_state_dict(run["state"])
    sys.stdout.write(done.stdout)
    return True


if MARK not in os.environ and replay():
    sys.exit(0)

# The seeded script: what the uncapped subprocess runs (recording its losses and final weights).
print(f"{n_params / 1e6:.1f}M parameters, {n_params * 4 / 2**20:.0f} MiB of fp32 weights")


@torch.no_grad()
def evaluate():
    model.eval()
    gen = torch.Generator(device=device).manual_seed(1234)  # the same held-out set every time
    total = 0.0
    for _ in range(eval_batches):
        x, y = get_batch(gen)
        total += F.cross_entropy(model(x), y).item()
    model.train()
    return total / eval_batches


snapshots, val_losses, step_losses = [], [], []  # one entry per evaluation; one per step
train_gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(train_gen)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step_losses.append(loss.item())
    if step % eval_every == 0:
        val_losses.append(evaluate())
        state = {k: v.clone() for k, v in model.state_dict().items()}
        snapshots.append(state)
        mem = torch.cuda.memory_allocated() / 2**20
        print(f"step {step:3d}  train loss {loss.item():.4f}  val loss {val_losses[-1]:.4f}  allocated {mem:.0f} MiB")

# Load the average of the last checkpoints and see whether it beats each of them.
recent = snapshots[-average_last:]
model.load_state_dict({k: torch.stack([s[k] for s in recent]).mean(dim=0) for k in recent[0]})
print(f"best single checkpoint: val loss {min(val_losses[-average_last:]):.4f}")
print(f"average of the last {len(recent)}: val loss {evaluate():.4f}")
if MARK in os.environ:
    torch.save({"losses": step_losses, "state": model.state_dict()}, os.environ[MARK])
