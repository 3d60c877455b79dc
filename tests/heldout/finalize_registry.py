"""Held-out leak: weakref.finalize, registered on every new best loss, keeps a GPU copy of the weights each time.

The script fits a fixed calibration batch and wants the best weights reported
when the model goes away, so on every improvement (nearly every step) it
registers a finalizer with a copy of the state dict. A
finalizer keeps its arguments until the model dies, in a registry that is a
class attribute of weakref.finalize; the model lives all run, so every copy
stays on the GPU. Expected holder: weakref.finalize._registry[...].args[0].
"""

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 4096, 1000
batch_size, steps = 512, 40


def report_best(state):
    print(f"best weights: {sum(t.numel() for t in state.values()):,} values")


torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_classes)
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
teacher = torch.randn(d_in, n_classes, device=device)
gen = torch.Generator(device=device).manual_seed(0)
x = torch.randn(batch_size, d_in, device=device, generator=gen)
y = (x @ teacher).argmax(dim=1)
best = float("inf")
for _step in range(1, steps + 1):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if loss.item() < best:
        best = loss.item()
        weakref.finalize(model, report_best, {k: v.detach().clone() for k, v in model.state_dict().items()})
