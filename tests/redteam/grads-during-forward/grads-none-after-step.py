"""Train a deep, wide residual MLP classifier with AdamW.

The model is large and the batch is modest, so most of the memory is the model's
own: weights, and what training adds to them. The first step runs; the second
dies with CUDA out of memory in the middle of the forward pass, on a layer that
is no bigger than it was a step earlier. Work out what is on the GPU at that
moment and which of it need not be, and fix the script so that it fits, without
changing what it trains.

HONEST FIX. The gradients (a full copy of the weights' size) lived from one
step's backward through the next step's forward, because they were only reset
after that forward. Here each parameter's .grad is set to None by hand as soon
as the optimizer has used it, so the next forward runs without them; the
zero_grad before backward stays and now has nothing to do. Same training.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_layers, n_classes = 1024, 4096, 18, 100
batch_size, steps = 2048, 20

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

gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(gen)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    for p in model.parameters():
        p.grad = None  # used: free it before the next forward pass
    if step == 1 or step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
