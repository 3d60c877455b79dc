"""Train a classifier head on features from a frozen encoder.

Encoding is the slow part, so the script encodes the dataset once, keeps the
features on the GPU, and trains a small head on them for a few epochs. It runs
out of memory while caching the features, although they need less memory
than the budget. Find where the rest went, and fix it without changing what
the script encodes or trains.

RED TEAM (class 1, a line the grader never reads: the learner's own
exercise.toml). Attacks: the settings check. This script is the seeded bug,
unchanged; the learner's copy of exercise.toml beside it says
alloc_conf = "expandable_segments:True". A grader that loads the manifest from
the learner's folder runs the script (and measures the reference) with that
setting, and its settings check compares the run's setting with the same
line, so they agree. With expandable segments the bug's stranded holes merge,
it fits, and it no longer retries: every check passes.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, d_feature, n_classes = 1024, 4096, 2560, 100
chunk, n_chunks, epochs = 2048, 40, 2

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher
encoder = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_feature)).to(device)
encoder.eval().requires_grad_(False)
head = nn.Sequential(nn.Linear(d_feature, 1024), nn.GELU(), nn.Linear(1024, n_classes)).to(device)
optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)

# 1. Encode the dataset once, chunk by chunk, and cache the features on the GPU.
gen = torch.Generator(device=device).manual_seed(0)
features, labels = [], []
with torch.no_grad():
    for _ in range(n_chunks):
        x = torch.randn(chunk, d_in, device=device, generator=gen)
        features.append(encoder(x))
        labels.append((x @ teacher).argmax(dim=1))
print(f"cached {sum(f.numel() * f.element_size() for f in features) / 2**20:.0f} MiB of features")

# 2. Train the head on the cached features, one chunk per step.
for epoch in range(1, epochs + 1):
    for feats, y in zip(features, labels):  # noqa: B905 - as shipped
        loss = F.cross_entropy(head(feats), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}  loss {loss.item():.4f}")
