"""Held-out leak: a training callback's closure keeps every step's hidden activations.

A small Trainer calls its callbacks with each step's hidden activations. The
norm tracker means to average the activation norm over 50 steps, but its
closure appends the activations themselves to a list it only empties every
50 steps. Expected holder: self.callbacks[0].__closure__['hidden'][i], seen
from Trainer.fit().
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 512, 4096, 256
batch_size, steps = 8192, 40


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU())
        self.head = nn.Linear(d_hidden, n_classes)


class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.callbacks = []
        self.gen = torch.Generator(device=device).manual_seed(0)

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def fit(self, steps):
        for step in range(1, steps + 1):
            x = torch.randn(batch_size, d_in, device=device, generator=self.gen)
            y = torch.randint(n_classes, (batch_size,), device=device, generator=self.gen)
            hidden = self.model.encoder(x)
            loss = F.cross_entropy(self.model.head(hidden), y)
            for callback in self.callbacks:
                callback(step, hidden, loss)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()


def norm_tracker(every=50):
    hidden = []

    def track(step, activations, loss):
        hidden.append(activations)
        if step % every == 0:
            print(f"step {step}: mean activation norm {torch.stack([h.norm() for h in hidden]).mean().item():.3f}")
            hidden.clear()

    return track


torch.manual_seed(0)
model = Net().to(device)
trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01))
trainer.add_callback(norm_tracker())
trainer.fit(steps)
