"""Held-out leak: functools.lru_cache memoises a GPU tensor for every sequence length it has seen.

An attention layer adds a position bias (one plane per head) that depends only
on the sequence length, so it is computed once per length and cached. Batches
come in ragged lengths, so the cache gains a large tensor almost every step;
the cache is a C structure inside the wrapper, out of sight of any attribute.
The run dies in the backward pass, where the step's own graph is in flight: the
hunt must blame the cache, not that graph. Expected holder:
alibi_bias (functools.lru_cache)[LENGTH].
"""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_model, n_heads, vocab = 256, 8, 4096
batch_size, steps = 1, 40


@functools.lru_cache(maxsize=256)
def alibi_bias(length):
    """The (heads, length, length) linear position bias, with the future masked out."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1, device=device) / n_heads)
    pos = torch.arange(length, device=device)
    distance = (pos[None, :] - pos[:, None]).float()
    bias = slopes[:, None, None] * distance
    return bias.masked_fill(distance > 0, float("-inf"))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        b, n = tokens.shape
        q, k, v = self.qkv(self.embed(tokens)).view(b, n, 3, n_heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5) + alibi_bias(n)
        mixed = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, d_model)
        return self.out(mixed)


torch.manual_seed(0)
model = Attention().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator(device=device).manual_seed(0)
lengths = torch.randperm(32, generator=torch.Generator().manual_seed(0)) * 32 + 1024  # ragged, all different
for step in range(1, steps + 1):
    n = int(lengths[step % len(lengths)])
    tokens = torch.randint(vocab, (batch_size, n + 1), device=device, generator=gen)
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
