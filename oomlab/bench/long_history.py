"""A script that is not in the course: twelve epochs that keep every step's logits in a dict.

``oomlab dev bench`` times the tools on it, because a long run is where a tool's
cost shows: 840 optimizer steps, and a dict that grows by one 4 MiB tensor per
step. Run uncapped on a large GPU it finishes; ``oomlab hunt`` names the dict.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
epochs, steps_per_epoch = 12, 70
batch_size, d_in, d_hidden, n_classes = 1024, 256, 512, 1000

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_classes)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

predictions = {}  # kept "for later analysis": one batch of logits per step, and so 4 MiB more per step
for epoch in range(epochs):
    for step in range(steps_per_epoch):
        x = torch.randn(batch_size, d_in, device=device)
        y = x[:, :10].argmax(dim=1)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        predictions[(epoch, step)] = logits.detach()
    print(f"epoch {epoch}  loss {loss.item():.3f}  kept {len(predictions)} batches of logits")
