"""Held-out leak: each sample and its augmented views refer to each other, so only the collector frees them.

A Sample keeps its views, and each View keeps its sample. When the next step
replaces the sample, reference counting cannot free the old one; the garbage
collector can, but the script raised its threshold so that collections (and
their pauses) come rarely, and the flipped copies pile up on the GPU.
Expected holder: a reference cycle, through a View's pixels.
"""

import gc

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
channels, size, n_classes = 3, 96, 10
batch_size, steps = 1024, 40


class View:
    def __init__(self, sample, pixels):
        self.sample, self.pixels = sample, pixels


class Sample:
    def __init__(self, images, labels):
        self.labels = labels
        self.views = [View(self, images), View(self, images.flip(-1))]


gc.set_threshold(100_000, 50, 50)  # fewer, shorter pauses
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(channels * size * size, 512), nn.ReLU(), nn.Linear(512, n_classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
gen = torch.Generator(device=device).manual_seed(0)
for _step in range(1, steps + 1):
    images = torch.rand(batch_size, channels, size, size, device=device, generator=gen)
    labels = torch.randint(n_classes, (batch_size,), device=device, generator=gen)
    sample = Sample(images, labels)
    loss = sum(F.cross_entropy(model(view.pixels), sample.labels) for view in sample.views) / len(sample.views)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
