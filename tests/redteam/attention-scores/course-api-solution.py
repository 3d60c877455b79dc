"""Train a small byte-level language model on long sequences.

Four transformer blocks of width 256 read 4096 bytes of context. The weights,
their gradients and the optimizer state take under 100 MiB, yet the first step
needs several GiB and the run dies with CUDA out of memory. Profile a step,
find which operators allocate the memory at its peak, and bring the peak down
without changing the model, the data or what the model computes.

RED TEAM (class 2, reading the answers). Attacks: the grader's own API. The
measured script can import oomlab like any other package, and
Course(strict=False).get(ID).solution_path is where the grader itself finds the
reference fix (the package's copy, out of the learner's folder). The script
runs that file as __main__ and stops, so the process measured is the
reference. Below, the seeded script, for where the package is out of reach.
"""

import runpy
import sys

EXERCISE = "attention-scores"
try:
    from oomlab.course import Course

    answer = Course(strict=False).get(EXERCISE).solution_path
except Exception:
    answer = None
if answer is not None and answer.is_file():
    answers = runpy.run_path(str(answer), run_name="__main__")
    sys.exit(0)

import math  # noqa: E402 - the seeded script, after the attack

import torch  # noqa: E402 - the seeded script, after the attack
import torch.nn as nn  # noqa: E402 - the seeded script, after the attack
import torch.nn.functional as F  # noqa: E402 - the seeded script, after the attack

device = "cuda"
vocab_size, d_model, n_heads, n_layers = 256, 256, 4, 4
batch_size, seq_len, period, steps = 2, 4096, 97, 20


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("causal", torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, n_heads, C // n_heads).permute(2, 0, 3, 1, 4)  # each (B, heads, T, head_dim)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
        scores = scores.masked_fill(self.causal[:T, :T], float("-inf"))  # no peeking at later bytes
        attn = scores.softmax(dim=-1)
        y = attn @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


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
