"""Train a token tagger on batches of sequences whose length varies from step to step.

The tagger labels every token on its own: a token embedding plus sinusoidal
position features, a stack of MLP blocks, and a classifier at each position.
Like real text, the batches come in all lengths, from 64 to 2048 tokens. The
longest batch fits the memory budget with room to spare, yet after a few dozen
steps the run dies with CUDA out of memory, holding far more than its tensors
need. Find where the memory went and fix it, without changing the model, the
data or the loss that any real token contributes.

HONEST FIX (an allocator setting, which this exercise accepts:
learner_settings = true). The batches' lengths are the data and stay ragged;
the allocator stops carving a segment per size instead. The setting is made at
the very top, before torch is imported, under the variable's newer name
PYTORCH_ALLOC_CONF (PyTorch reads it as well as PYTORCH_CUDA_ALLOC_CONF):
expandable segments, so pages freed by one length back the next length's
activations. The same model, data and loss.
"""

import functools
import os

os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"  # set before torch is imported
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
vocab_size, n_tags, d_model, n_layers = 8192, 64, 512, 4
batch_size, min_len, max_len, steps = 8, 64, 2048, 40


@functools.lru_cache(maxsize=None)  # noqa: UP033 - as shipped
def position_table(length):
    """Sinusoidal position features, (length, d_model): computed once per length, then reused."""
    pos = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2, device=device) * (-math.log(10000.0) / d_model))
    table = torch.empty(length, d_model, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(self.norm(x))))


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.Sequential(*[Block(d_model) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_tags)

    def forward(self, tokens):
        x = self.embed(tokens) + position_table(tokens.shape[1])
        return self.head(self.norm(self.blocks(x)))


torch.manual_seed(0)
model = Tagger().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
token_tag = torch.randint(n_tags, (vocab_size,), device=device)  # a fixed random tag for each token


def get_batch(gen):
    """A batch of random sequences; the tag of a token depends on the token and on its position."""
    length = int(torch.randint(min_len, max_len + 1, (1,), device=device, generator=gen))
    tokens = torch.randint(vocab_size, (batch_size, length), device=device, generator=gen)
    tags = (token_tag[tokens] + torch.arange(length, device=device) // 256) % n_tags
    return tokens, tags


gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    tokens, tags = get_batch(gen)
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  length {tokens.shape[1]:4d}  loss {loss.item():.4f}")
