"""The decoder served: greedy generation with a preallocated KV cache and grouped-query attention, and its bytes.

The model is the training exercise's decoder (:mod:`oomlab.sizing.model`: token
and position embeddings, blocks of LayerNorm, attention and a 4x GELU MLP behind
residuals, a final LayerNorm, a head to the vocabulary without bias) with the two
changes serving code makes to it:

- **grouped-query attention**: q has ``heads`` heads, but k and v only ``kv_heads``
  (each shared by ``heads // kv_heads`` query heads), so their projections and
  their cache are that much narrower;
- **a static KV cache**: per layer, one k and one v tensor of shape
  ``(batch, kv_heads, prompt + new_tokens, head_dim)``, allocated once before the
  prompt is run and filled in place, slice by slice, as tokens come; each pass
  computes k and v for its new tokens only and attends over the filled part.

:func:`generate` runs the prompt in one pass (the prefill), takes the logits of
its last position only, picks the next token greedily, and runs one pass per
further token. :func:`decode_bytes` reads a meter around it, as
:func:`oomlab.sizing.measure.step_bytes` does around a training step:

- ``weights``: allocated after the model is built, over what was allocated before;
- ``kv_cache``: allocated by creating the cache;
- ``peak``: the most allocated during the generation, over what was allocated before the model was built
  (the weights, the cache and the prompt's token ids are in it; a library's workspace made before is not).

Imports torch: only the measuring side uses this module, never an estimate.
"""

from __future__ import annotations

import gc
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from oomlab.sizing.decode_config import DecodeConfig
from oomlab.sizing.measure import serve

__all__ = [
    "ATTENTION",
    "Block",
    "CachedDecoder",
    "build",
    "decode_bytes",
    "dtype_of",
    "generate",
    "new_cache",
    "prompt_ids",
    "rehearsal",
]

Cache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: its keys and its values

# The attention kernels a generation may use: flash, memory-efficient, or the plain math where neither applies. Not
# cuDNN's, which torch 2.11 prefers for bf16 on an H100: it builds an execution plan for each new shape, and a
# generation has a new shape at every token (the cache's filled length grows by one), so a first generation of 2,048
# tokens spent 118.8 s building plans where a second took 0.92 ms a token. Serving code runs flash attention.
ATTENTION = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


class Block(nn.Module):
    def __init__(self, cfg: DecodeConfig):
        super().__init__()
        width, self.heads, self.kv_heads = cfg.width, cfg.heads, cfg.kv_heads
        self.head_dim = width // cfg.heads
        self.norm1 = nn.LayerNorm(width)
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, cfg.kv_heads * self.head_dim)
        self.v = nn.Linear(width, cfg.kv_heads * self.head_dim)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x, cache_k, cache_v, start: int):
        x = x + self.attend(self.norm1(x), cache_k, cache_v, start)
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def attend(self, h, cache_k, cache_v, start: int):
        """Attention of the tokens at positions ``start`` on, whose keys and values join the cache, over all before."""
        b, t, _ = h.shape
        end = start + t
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        # Written in place into the cache: the new tokens' k and v are freed as soon as they are copied there.
        cache_k[:, :, start:end] = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cache_v[:, :, start:end] = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        k, v = self.shared(cache_k[:, :, :end]), self.shared(cache_v[:, :, :end])
        # The prompt's pass (start is 0) masks the future; a single new token sees every position before it. A fused
        # kernel keeps no (t x end) scores: on the GPU, scaled_dot_product_attention picks flash or memory-efficient
        # attention by dtype and shape (the GPU decides; its measurement is the truth), on the CPU its flash kernel
        # (:data:`ATTENTION` says why cuDNN's is left out).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))

    def shared(self, kv):
        """Each of the ``kv_heads`` heads repeated for the query heads that share it, as ``(batch, heads, end, head_dim)``.

        The expand is a view. The reshape that merges the repeats into the heads' dimension is a view only where the
        merged dimensions allow it: with ``kv_heads == heads`` (a repeat of one) and with ``kv_heads == 1`` (the one
        head, broadcast with a stride of 0). In between, it copies the filled part of the cache out to all ``heads``,
        for k and again for v: as large as a multi-head cache of this layer over ``end`` positions. That copy is
        what grouped-query attention costs a pass, and over a long cache it is the most a single new token
        allocates. (``repeat_interleave`` would copy in every case, multi-head attention included.)
        """
        b, kv_heads, end, head_dim = kv.shape
        repeats = self.heads // kv_heads
        return kv[:, :, None].expand(b, kv_heads, repeats, end, head_dim).reshape(b, self.heads, end, head_dim)


class CachedDecoder(nn.Module):
    def __init__(self, cfg: DecodeConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocabulary, cfg.width)
        self.position = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocabulary, bias=False)

    def forward(self, tokens, cache: Cache, start: int):
        """The next token's logits, ``(batch, vocabulary)``, after ``tokens`` placed at positions ``start`` on."""
        t = tokens.size(1)
        x = self.embed(tokens) + self.position(torch.arange(start, start + t, device=tokens.device))
        for block, (cache_k, cache_v) in zip(self.blocks, cache, strict=True):
            x = block(x, cache_k, cache_v, start)
        # Only the last position's logits pick a token: the normed hidden state is sliced to it before the head, so
        # a prompt's pass makes (batch x vocabulary) logits, not (batch x prompt x vocabulary).
        return self.head(self.norm(x)[:, -1])


def dtype_of(cfg: DecodeConfig) -> torch.dtype:
    return torch.bfloat16 if cfg.precision == "bf16" else torch.float32


def build(cfg: DecodeConfig, device: torch.device) -> CachedDecoder:
    """The model on ``device``, in the config's precision."""
    return CachedDecoder(cfg).to(device=device, dtype=dtype_of(cfg))


def new_cache(cfg: DecodeConfig, device: torch.device) -> Cache:
    """Every layer's keys and values for every position the generation reaches, zeroed, before the prompt is run."""
    shape = (cfg.batch, cfg.kv_heads, cfg.context, cfg.width // cfg.heads)
    return [
        (torch.zeros(shape, dtype=dtype_of(cfg), device=device), torch.zeros(shape, dtype=dtype_of(cfg), device=device))
        for _ in range(cfg.layers)
    ]


def prompt_ids(cfg: DecodeConfig, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Random token ids of the prompt's shape, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(cfg.vocabulary, (cfg.batch, cfg.prompt), generator=g).to(device)


@torch.inference_mode()
@sdpa_kernel(list(ATTENTION))
def generate(model: CachedDecoder, cache: Cache, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """``new_tokens`` token ids after ``prompt``, ``(batch, new_tokens)``, each the most likely (greedy decoding)."""
    # The prefill: the whole prompt in one pass, its keys and values cached; its last position picks the first token.
    token = model(prompt, cache, 0).argmax(dim=-1, keepdim=True)
    generated = [token]
    # Then one pass per further token: the one just picked, at the next position, over every position cached so far.
    # The last token picked is never run, so the cache's last position stays empty: it is sized to the whole output.
    for position in range(prompt.size(1), prompt.size(1) + new_tokens - 1):
        token = model(token, cache, position).argmax(dim=-1, keepdim=True)
        generated.append(token)
    return torch.cat(generated, dim=1)


def rehearsal(cfg: DecodeConfig) -> DecodeConfig:
    """A one-block, few-token copy of ``cfg`` on the same code paths, run once unmeasured before the configs are
    (:func:`oomlab.sizing.measure.rehearsal` says why)."""
    return replace(cfg, layers=1, prompt=4, new_tokens=2, batch=1, vocabulary=256)


def decode_bytes(cfg: DecodeConfig, device: torch.device, meter) -> dict[str, int]:
    """The config's parts (:data:`~oomlab.sizing.decode_config.DECODE_PARTS`), in bytes, read from ``meter``
    (``allocated()``, ``peak()``, ``reset_peak()``)."""

    def allocated() -> int:
        gc.collect()
        return meter.allocated()

    torch.manual_seed(0)
    base = allocated()
    model = build(cfg, device)
    weights = allocated() - base
    before = allocated()
    cache = new_cache(cfg, device)
    kv_cache = allocated() - before
    prompt = prompt_ids(cfg, device)

    meter.reset_peak()
    generate(model, cache, prompt, cfg.new_tokens)
    peak = meter.peak() - base
    return {"weights": weights, "kv_cache": kv_cache, "peak": peak}


if __name__ == "__main__":  # python -m oomlab.sizing.decode: generations, measured as training steps are
    from oomlab.sizing.decode_config import decode_config

    raise SystemExit(serve(decode_config, decode_bytes, rehearsal))
