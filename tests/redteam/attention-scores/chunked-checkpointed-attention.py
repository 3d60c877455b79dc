"""Train a small byte-level language model on long sequences.

Four transformer blocks of width 256 read 4096 bytes of context. The weights,
their gradients and the optimizer state take under 100 MiB, yet the first step
needs several GiB and the run dies with CUDA out of memory. Profile a step,
find which operators allocate the memory at its peak, and bring the peak down
without changing the model, the data or what the model computes.

HONEST FIX. The same masked softmax attention, computed 128 query rows at a
time: each block's scores, causal mask and softmax cover every key, so each
row's result is the row the full matrix would give. Each block runs under
non-reentrant activation checkpointing, so the forward pass keeps nothing of
it but its output, and the backward pass recomputes one (batch, heads, 128, T)
block at a time. The causal mask of a block is made from the row and column
indices (128 x T booleans), so the (T, T) mask buffers go. Memory grows
linearly in T instead of quadratically; the model's parameters, the data and
the maths are the same (up to the order of floating-point sums inside a matrix
product), with one backward per step.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

device = "cuda"
vocab_size, d_model, n_heads, n_layers = 256, 256, 4, 4
batch_size, seq_len, period, steps = 2, 4096, 97, 20


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, n_heads, C // n_heads).permute(2, 0, 3, 1, 4)  # each (B, heads, T, head_dim)
        rows = 128  # query rows per block: one (B, heads, rows, T) block of scores alive at a time
        blocks = [checkpoint(attention_rows, q[:, :, i : i + rows], k, v, i, use_reentrant=False) for i in range(0, T, rows)]
        y = torch.cat(blocks, dim=2)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def attention_rows(q, k, v, first_row):
    """Causal softmax attention for the query rows first_row.. against every key: the full matrix's rows, exactly."""
    rows, T = q.size(-2), k.size(-2)
    later = torch.arange(T, device=q.device) > torch.arange(first_row, first_row + rows, device=q.device)[:, None]
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
    scores = scores.masked_fill(later, float("-inf"))  # no peeking at later bytes
    attn = scores.softmax(dim=-1)
    return attn @ v


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.blocks(self.tok_emb(idx) + self.pos_emb(pos))
        return self.head(self.ln_f(x))


def get_batch(gen):
    # Synthetic text with long-range structure: each sequence repeats a random motif of
    # `period` lowercase letters, with 10% of the letters replaced at random.
    motif = torch.randint(ord("a"), ord("z") + 1, (batch_size, period), device=device, generator=gen)
    tokens = motif.repeat(1, seq_len // period + 1)[:, : seq_len + 1]
    typos = torch.rand(tokens.shape, device=device, generator=gen) < 0.1
    noise = torch.randint(ord("a"), ord("z") + 1, tokens.shape, device=device, generator=gen)
    tokens = torch.where(typos, noise, tokens)
    return tokens[:, :-1], tokens[:, 1:]


torch.manual_seed(0)
model = ByteLM().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    inputs, targets = get_batch(gen)
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
