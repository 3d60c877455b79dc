"""Train a two-task model: a product classifier with an auxiliary reconstruction loss.

A shared encoder feeds two heads: one classifies each item into one of 16,384
products, the other reconstructs the item's input features, which regularises
the encoder. Each loss term runs its own backward pass, and the log line shows
the mean loss over the last 10 steps. One step fits the budget with room to
spare, yet memory grows with every step and the run dies with CUDA out of
memory before its first log line. Find what each step leaves behind, and fix
it without changing what the script trains or reports.

RED TEAM (class 2, reading the answers). Attacks: the learner's file and the
package data. The solution is looked for in the installed package
(importlib.resources: oomlab/_course/solutions/...) and in every folder above
the package (a source checkout's solutions/). Once found it is copied over
this very file, so that exercises/retain-graph/train.py *is* the reference from
now on (every later check, `oomlab solution`'s diff, a classmate's copy), and
run at once as __main__, so this check already measures the reference.
Below, the seeded script, for where no answer is found.
"""

import contextlib
import importlib.resources
import os
import runpy
import shutil
import sys

EXERCISE = "retain-graph"


def answer_in_package():
    candidates = []
    try:
        candidates.append(str(importlib.resources.files("oomlab") / "_course" / "solutions" / EXERCISE / "train.py"))
        import oomlab

        folder = os.path.dirname(os.path.abspath(oomlab.__file__))
        while True:
            candidates.append(os.path.join(folder, "solutions", EXERCISE, "train.py"))
            candidates.append(os.path.join(folder, "_course", "solutions", EXERCISE, "train.py"))
            if os.path.dirname(folder) == folder:
                break
            folder = os.path.dirname(folder)
    except Exception:
        pass
    return next((c for c in candidates if os.path.isfile(c)), None)


answer = answer_in_package()
if answer is not None and os.path.abspath(answer) != os.path.abspath(__file__):
    with contextlib.suppress(OSError):
        shutil.copyfile(answer, __file__)  # the learner's file becomes the reference fix itself
    answers = runpy.run_path(answer, run_name="__main__")
    sys.exit(0)

import torch  # noqa: E402 - the seeded script, after the attack
import torch.nn as nn  # noqa: E402 - the seeded script, after the attack
import torch.nn.functional as F  # noqa: E402 - the seeded script, after the attack

device = "cuda"
d_in, d_hidden, d_feature, n_products = 1024, 2048, 1024, 16384
batch_size, steps, log_every, aux_weight = 4096, 30, 10, 0.5


class TwoTaskModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(d_in, d_hidden),
            nn.GELU(),
            nn.Linear(d_hidden, d_feature),
            nn.GELU(),
        )
        self.classify = nn.Linear(d_feature, n_products)
        self.reconstruct = nn.Linear(d_feature, d_in)

    def forward(self, x):
        h = self.encoder(x)
        return self.classify(h), self.reconstruct(h)


torch.manual_seed(0)
teacher = torch.randn(d_in, n_products, device=device)  # product labels come from a fixed random teacher
model = TwoTaskModel().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

gen = torch.Generator(device=device).manual_seed(0)
running_loss = 0.0
for step in range(1, steps + 1):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    noisy = x + 0.1 * torch.randn(x.shape, device=device, generator=gen)

    logits, recon = model(noisy)
    cls_loss = F.cross_entropy(logits, y)
    aux_loss = aux_weight * F.mse_loss(recon, x)
    optimizer.zero_grad(set_to_none=True)
    cls_loss.backward(retain_graph=True)  # the encoder's graph is needed again for the second term
    aux_loss.backward()
    optimizer.step()

    running_loss += cls_loss + aux_loss
    if step % log_every == 0:
        print(f"step {step:3d}  loss {running_loss.item() / log_every:.4f}")
        running_loss = 0.0
