"""Train a small next-token model with gradient accumulation.

Each optimizer step learns from 32,768 contexts, far more than one forward pass
should hold, so the step is split into micro-batches of 4,096 and the gradients
are accumulated before the update. Yet memory climbs with every micro-batch,
and the run dies with CUDA out of memory in its first step. Find what each
micro-batch leaves behind, and fix it without changing the batch, the data or
the update.

HONEST FIX. The step keeps its single backward of the running total, the
mean over the whole batch, but each micro-batch's forward and loss run under
non-reentrant activation checkpointing: the graph the total keeps for a
micro-batch holds only its input tokens and targets, not its activations.
The one backward recomputes each micro-batch's forward when it reaches it,
one micro-batch at a time. The same batch, data and mean loss, one backward
per step; gradients equal up to the order in which the eight micro-batches'
contributions are summed.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

device = "cuda"
vocab_size, context, d_embed, d_hidden = 16384, 8, 128, 2048
micro_batch, accum_steps, steps = 4096, 8, 20  # 32,768 contexts per optimizer step


class NgramLM(nn.Module):
    """Predicts the next token from the previous `context` tokens (an MLP over their embeddings)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_embed)
        self.mlp = nn.Sequential(
            nn.Linear(context * d_embed, d_hidden),
            nn.GELU(),
            nn.Linear(d_hidden, d_hidden),
            nn.GELU(),
            nn.Linear(d_hidden, vocab_size),
        )

    def forward(self, idx):
        return self.mlp(self.embed(idx).flatten(1))


def get_batch(gen):
    # Synthetic text: each sequence counts upwards from a random token with its own stride, with typos.
    start = torch.randint(vocab_size, (micro_batch, 1), device=device, generator=gen)
    stride = torch.randint(1, 5, (micro_batch, 1), device=device, generator=gen)
    tokens = (start + stride * torch.arange(context + 1, device=device)) % vocab_size
    typos = torch.rand(tokens.shape, device=device, generator=gen) < 0.05
    tokens = torch.where(typos, torch.randint(vocab_size, tokens.shape, device=device, generator=gen), tokens)
    return tokens[:, :-1], tokens[:, -1]


def micro_batch_loss(xb, yb):
    return F.cross_entropy(model(xb), yb)


torch.manual_seed(0)
model = NgramLM().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for _ in range(accum_steps):
        xb, yb = get_batch(gen)
        loss = checkpoint(micro_batch_loss, xb, yb, use_reentrant=False)  # keeps xb and yb, not the activations
        total = total + loss / accum_steps  # the mean over the whole batch
    total.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  loss {total.item():.4f}")
