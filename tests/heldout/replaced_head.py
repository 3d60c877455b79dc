"""Held-out leak: each task's new head is added to the optimizer, and the old heads stay in it.

Continual learning over a series of tasks: every task gets a fresh
classification head, and the optimizer is told about it with
add_param_group. The old head is gone from the model, but its parameters and
their two AdamW moments stay in the optimizer's param groups and state,
trained by nothing. Expected holder: global 'optimizer', path into its state.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 4096, 8192
batch_size, tasks, steps_per_task = 256, 12, 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU())
        self.head = nn.Linear(d_hidden, n_classes)

    def forward(self, x):
        return self.head(self.body(x))


torch.manual_seed(0)
model = Net().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
generator = torch.Generator(device=device).manual_seed(0)
for task in range(tasks):
    if task:
        model.head = nn.Linear(d_hidden, n_classes).to(device)  # a fresh head, 128 MiB, for the new task's classes
        optimizer.add_param_group({"params": model.head.parameters()})
    for _ in range(steps_per_task):
        x = torch.randn(batch_size, d_in, device=device, generator=generator)
        y = torch.randint(n_classes, (batch_size,), device=device, generator=generator)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"task {task}: loss {loss.item():.3f}")
