"""Held-out leak: a helper keeps every batch's features in its mutable default argument.

drift() compares this batch's mean feature with the mean over the last few
batches. Its history is a default argument, a list made once when the
function was defined, and it only ever reads the last `window` entries: the
list keeps every batch's features. Expected holder: drift.__defaults__[1][i].
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_feature, n_classes = 512, 4096, 100
batch_size, steps = 8192, 40


def drift(features, window=8, history=[]):  # noqa: B006 - the leak this script seeds
    """How far this batch's mean feature is from the mean of the last `window` batches."""
    history.append(features.detach())
    recent = torch.stack([h.mean(dim=0) for h in history[-window:]])
    return (features.detach().mean(dim=0) - recent.mean(dim=0)).norm().item()


torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(d_in, d_feature), nn.GELU()).to(device)
head = nn.Linear(d_feature, n_classes).to(device)
optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=1e-2)
gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    y = torch.randint(n_classes, (batch_size,), device=device, generator=gen)
    features = encoder(x)
    loss = F.cross_entropy(head(features), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.4f}, drift {drift(features):.4f}")
    else:
        drift(features)
