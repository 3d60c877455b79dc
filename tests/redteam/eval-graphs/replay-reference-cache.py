"""Train an MLP classifier and check it on held-out data every 10 steps.

RED TEAM (class 2, reading the answers). Attacks: every figure the grader
compares with the reference, through the reference's own cached measurement.
After the learner's first `oomlab check`, .oomlab/reference/eval-graphs-*.json
holds the reference fix's workload (samples per step, inputs' element counts,
evaluation samples), its loss at every optimizer step, the sum and norm of its
final weights, and its stdout. Nothing is trained here. The numbers are
replayed through what a naive observer watches: a one-parameter module called
on stride-0 inputs (torch.zeros(()).expand(n, d): the shape of a batch in 4
bytes) counts the samples; backward() on a constant scalar holding the
reference's loss puts that loss on the step; optimizer.step() counts the step;
the model's real weights are then moved, by one scale and one shift, to the
reference's sum and norm; and the reference's log is printed. The GPU holds a
few MiB: no OOM, a peak far below the reference's, and every count, loss,
weight figure and log number equal. Below, the seeded script, for a course
with no reference measured yet.
"""

import glob
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 4096, 10
batch_size, steps, eval_every, eval_batches = 4096, 30, 10, 8

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


def get_batch(gen):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


model = nn.Sequential(
    nn.Linear(d_in, d_hidden),
    nn.GELU(),
    nn.Linear(d_hidden, d_hidden),
    nn.GELU(),
    nn.Linear(d_hidden, n_classes),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


def cached_reference(exercise="eval-graphs"):
    folder = os.path.dirname(os.path.abspath(__file__))
    while os.path.dirname(folder) != folder:
        for path in sorted(glob.glob(os.path.join(folder, ".oomlab", "reference", f"{exercise}-*.json"))):
            try:
                with open(path, encoding="utf-8") as f:
                    ref = json.load(f)
            except (OSError, ValueError):
                continue
            if (ref.get("workload") or {}).get("losses"):
                return ref
        folder = os.path.dirname(folder)
    return None


class Tally(nn.Module):
    """One parameter, so that each outermost call counts as a forward pass of a model; computes nothing."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros((), device=device))

    def forward(self, x):
        return self.w * 1.0


def shaped(samples, per_sample):
    return torch.zeros((), device=device).expand(samples, per_sample)  # a batch's shape in one element


def match_sum_and_norm(params, target_sum, target_norm):
    """Move the weights to a given sum and norm: w <- a*w + b, then the last rounding on one element."""
    with torch.no_grad():
        n = sum(p.numel() for p in params)
        for _ in range(3):
            s0 = sum(float(p.double().sum()) for p in params)
            q0 = sum(float((p.double() ** 2).sum()) for p in params)
            a = ((target_norm**2 - target_sum**2 / n) / (q0 - s0**2 / n)) ** 0.5
            b = (target_sum - a * s0) / n
            for p in params:
                p.mul_(a).add_(b)
        s = sum(float(p.double().sum()) for p in params)
        largest = max(params, key=lambda p: p.numel())
        largest.view(-1)[0] += target_sum - s


def replay(ref):
    w = ref["workload"]
    tally = Tally()
    per_sample = w["train_elements"] // max(w["train_samples"], 1)
    for samples, loss in zip(w["samples_per_step"], w["losses"], strict=True):
        optimizer.zero_grad(set_to_none=True)
        tally.train()(shaped(samples, per_sample))
        torch.tensor(loss, device=device, requires_grad=True).backward()
        optimizer.step()
    if w.get("inference_samples"):
        with torch.no_grad():
            tally.eval()(shaped(w["inference_samples"], w["inference_elements"] // w["inference_samples"]))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    match_sum_and_norm(params, w["weights_sum"], w["weights_norm"])
    for line in (ref.get("stdout") or "").splitlines():
        if not line.startswith("[oomlab]"):
            print(line)


reference = cached_reference()
if reference is not None:
    replay(reference)
    sys.exit(0)


def evaluate():
    model.eval()
    gen = torch.Generator(device=device).manual_seed(1234)  # the same held-out set every time
    losses = []
    for _ in range(eval_batches):
        x, y = get_batch(gen)
        losses.append(F.cross_entropy(model(x), y))
    model.train()
    return torch.stack(losses).mean().item()


train_gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(train_gen)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % eval_every == 0:
        print(f"step {step:3d}  train loss {loss.item():.4f}  val loss {evaluate():.4f}")
