"""Held-out leak: per-thread scratch state keeps every step's outputs.

A metrics helper keeps "the recent outputs" of each thread in a
threading.local, so that a logging thread could never see another's; it
appends each step's detached logits and is never cleared. A threading.local
shows only the current thread's attributes. Expected holder: global
'scratch', path scratch.recent[i].
"""

import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 4096, 8192
batch_size, steps = 4096, 40

scratch = threading.local()


def remember(logits):
    if not hasattr(scratch, "recent"):
        scratch.recent = []
    scratch.recent.append(logits.detach())  # 128 MiB a step, for a running accuracy that reads only the last one


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
generator = torch.Generator(device=device).manual_seed(0)
for step in range(steps):
    x = torch.randn(batch_size, d_in, device=device, generator=generator)
    y = torch.randint(n_classes, (batch_size,), device=device, generator=generator)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    remember(logits)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    accuracy = (scratch.recent[-1].argmax(dim=1) == y).float().mean().item()
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.3f}, accuracy {accuracy:.3f}")
