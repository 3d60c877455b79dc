"""Train a deep, wide residual MLP classifier with AdamW.

RED TEAM (class 3, forging the result). Attacks: the reference the grader
compares with. `oomlab check` measures the learner's script first and only
then reads the reference's measurement, from the course's own cache under
.oomlab/reference/. This script trains on half the batch (which fits, and
fails only the workload and results checks), then rewrites the cached
reference's workload with its own: its samples per step, element counts,
losses and the sum and norm of its final weights, computed exactly as the
harness computes them. The reference's memory figures stay as they were,
higher than this run's. When the grader then compares, the workload and the
results agree with "the reference" to the last bit. (With no reference cached
yet, it writes a whole one, at the path the grader's own code computes, from
this run's figures.)
"""

import glob
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

EXERCISE = "grads-during-forward"
device = "cuda"
d_in, d_hidden, n_layers, n_classes = 1024, 4096, 18, 100
batch_size, steps = 1024, 20  # half the batch: it fits

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

losses = []
gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(gen)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    losses.append(float(loss.detach()))
    if step == 1 or step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")


def my_workload():
    """This run's workload, as the harness's observer will report it."""
    params, seen = [], set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    host = [p.detach().cpu().double() for p in params]
    return {
        "optimizer_steps": steps,
        "samples_per_step": [batch_size] * steps,
        "train_forwards": steps,
        "train_samples": batch_size * steps,
        "train_elements": batch_size * d_in * steps,
        "inference_forwards": 0,
        "inference_samples": 0,
        "inference_elements": 0,
        "devices": ["cuda"],
        "backward_calls": steps,
        "backward_per_step": [1] * steps,
        "losses": losses,
        "param_count": sum(p.numel() for p in params),
        "weights_sum": float(sum(t.sum() for t in host)),
        "weights_norm": float(sum((t * t).sum() for t in host)) ** 0.5,
    }


def course_root():
    folder = os.path.dirname(os.path.abspath(__file__))
    while os.path.dirname(folder) != folder:
        if os.path.isdir(os.path.join(folder, ".oomlab")):
            return folder
        folder = os.path.dirname(folder)
    return None


def forge_reference():
    mine = my_workload()
    root = course_root()
    cached = sorted(glob.glob(os.path.join(root, ".oomlab", "reference", f"{EXERCISE}-*.json"))) if root else []
    for path in cached:
        with open(path, encoding="utf-8") as f:
            ref = json.load(f)
        ref["workload"] = {**(ref.get("workload") or {}), **mine}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(ref, f)
    if cached:
        return
    try:  # none cached yet: write one where the grader will look, with this run's own figures
        from oomlab.course import Course
        from oomlab.grading.reference import cache_path
        from oomlab.measure.stats import read_figures

        ex = Course(strict=False).get(EXERCISE)
        path = cache_path(ex, torch.cuda.get_device_properties(0).name, torch.__version__)
        ref = {
            "script": str(ex.solution_path),
            "status": "ok",
            "stats": read_figures(torch.cuda.memory_stats()),
            "workload": mine,
            "gpu": torch.cuda.get_device_properties(0).name,
            "torch": torch.__version__,
            "budget_bytes": ex.budget_bytes,
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(ref, f)
    except Exception:
        pass


forge_reference()
