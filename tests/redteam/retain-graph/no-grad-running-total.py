"""Train a two-task model: a product classifier with an auxiliary reconstruction loss.

A shared encoder feeds two heads: one classifies each item into one of 16,384
products, the other reconstructs the item's input features, which regularises
the encoder. Each loss term runs its own backward pass, and the log line shows
the mean loss over the last 10 steps. One step fits the budget with room to
spare, yet memory grows with every step and the run dies with CUDA out of
memory before its first log line. Find what each step leaves behind, and fix
it without changing what the script trains or reports.

HONEST FIX. The running total for the log line is summed under
torch.no_grad(): the sum records no graph, so it no longer reaches the step's
retained graph (and the retained saved tensors go when the names are rebound
next step). Both backward passes stay as they are; the same gradients, the
same log.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

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

    with torch.no_grad():  # a number for the log line, not part of any graph
        running_loss += cls_loss + aux_loss
    if step % log_every == 0:
        print(f"step {step:3d}  loss {running_loss.item() / log_every:.4f}")
        running_loss = 0.0
