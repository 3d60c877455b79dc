"""The decoder the sizing exercises size, and one training step of it: read it as the estimate's specification.

A GPT in the shape most decoders share (nanoGPT's, without dropout or weight tying):
token and position embeddings, ``layers`` blocks of causal self-attention and a
4x-wide GELU MLP, each behind a LayerNorm and a residual, a final LayerNorm and a
linear head to the vocabulary, and the cross-entropy loss. Every ``nn.Linear`` of
the blocks has a bias; the head has none.

Attention is ``F.scaled_dot_product_attention``: on the GPU it picks a fused
kernel that never materialises the ``sequence x sequence`` scores, so nothing in
the step grows with the square of the sequence (a hand-written softmax attention
would keep one such matrix per head per layer for backward).

Imports torch: only the measuring side uses this module, never an estimate.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from oomlab.sizing.config import TrainConfig

__all__ = ["Block", "Decoder", "batch", "build", "forward", "make_optimizer", "train_step"]


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.checkpointing = cfg.checkpointing
        self.embed = nn.Embedding(cfg.vocabulary, cfg.width)
        self.position = nn.Embedding(cfg.sequence, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg.width, cfg.heads) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocabulary, bias=False)
        # Under autocast the loss is taken from fp32 logits, as mixed-precision loops commonly do: cross_entropy on
        # bf16 logits is cast differently by CUDA's autocast and the CPU's (their op lists differ), and the CPU's
        # count of a step must be the GPU's.
        self.fp32_loss = cfg.precision == "bf16-autocast"

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.position(torch.arange(tokens.size(1), device=tokens.device))
        for block in self.blocks:
            # Checkpointed, a block keeps only its input for backward and runs its forward again there.
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        logits = self.head(self.norm(x))
        if self.fp32_loss:
            logits = logits.float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    # foreach=True is what torch picks for AdamW and SGD on the GPU by itself; said here so that a count on the
    # CPU runs the same code. Adafactor keeps torch's default.
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if cfg.optimizer == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    return torch.optim.Adafactor(params, lr=1e-3)


def build(cfg: TrainConfig, device: torch.device) -> tuple[Decoder, torch.optim.Optimizer]:
    """The model on ``device`` in the config's precision, and its optimizer (which holds no state before its first step)."""
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    model = Decoder(cfg).to(device=device, dtype=dtype)
    return model, make_optimizer(cfg, model.parameters())


def batch(cfg: TrainConfig, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets of the config's shape, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(cfg.vocabulary, (cfg.batch, cfg.sequence + 1), generator=g)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def forward(cfg: TrainConfig, model: Decoder, tokens, targets):
    """The loss, under autocast in bfloat16 where the config's precision says so."""
    autocast = torch.autocast(tokens.device.type, dtype=torch.bfloat16) if cfg.precision == "bf16-autocast" else None
    with autocast or contextlib.nullcontext():
        return model(tokens, targets)


def train_step(cfg: TrainConfig, model: Decoder, optimizer: torch.optim.Optimizer, tokens, targets) -> None:
    """One step as training loops write it: forward, backward, step, and the gradients set to None."""
    loss = forward(cfg, model, tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
