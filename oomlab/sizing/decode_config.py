"""An inference configuration to size: a decoder generating from a prompt with a KV cache, and the parts of its bytes.

The training step's counterpart (:mod:`oomlab.sizing.config`) for serving: the
same decoder, but with grouped-query attention (``kv_heads`` key and value heads
shared by ``heads`` query heads), a prompt of ``prompt`` tokens and ``new_tokens``
generated after it, greedily, for ``batch`` sequences at once. Weights, cache and
compute are all in one dtype (``precision``): nothing is trained, so no fp32
master copy is kept anywhere.

A plain dict on the way in and out, checked here once: :func:`decode_config`
turns a dict into a :class:`DecodeConfig` or says which field is wrong. This
module imports no torch: an estimator and the drawing of configs do without it.

The parts of a generation (:data:`DECODE_PARTS`), each in bytes:

- ``weights``: what the model holds once built;
- ``kv_cache``: the keys and values of every layer for every position the
  generation will reach, allocated once before the prompt is run;
- ``peak``: the most allocated at once during the whole generation (the
  weights, the cache and the prompt's token ids included).

The tolerances (:data:`DECODE_TOLERANCE`) say what an estimate is expected to
know. The weights and the cache follow from the config exactly (a dtype's size
times a count), so they are held to 2%. The peak depends on which moment of
the generation holds the most besides them (the prompt's pass through a block,
its logits, or a late token's attention over a long cache), and on what the
attention kernel the GPU picks keeps aside: 15%.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from oomlab.errors import OomLabError
from oomlab.sizing.config import checked_fields

__all__ = ["DECODE_PARTS", "DECODE_TOLERANCE", "PRECISIONS", "DecodeConfig", "decode_config"]

DECODE_PARTS = ("weights", "kv_cache", "peak")
DECODE_TOLERANCE = {"weights": 0.02, "kv_cache": 0.02, "peak": 0.15}

# How the weights and the cache are kept and the generation computes:
PRECISIONS = {
    "fp32": "fp32 weights, cache and activations",
    "bf16": "bfloat16 weights, cache and activations, as models are served",
}


@dataclass(frozen=True)
class DecodeConfig:
    """Greedy generation with the course's cached decoder (:mod:`oomlab.sizing.decode`)."""

    layers: int  # transformer blocks
    width: int  # the model's width (d_model); each block's MLP is 4x as wide
    heads: int  # query heads; width must divide by it, and each head is width // heads wide
    kv_heads: int  # key and value heads, each shared by heads // kv_heads query heads (heads: multi-head; 1: multi-query)
    prompt: int  # tokens of the prompt, run in one forward pass
    new_tokens: int  # tokens generated after it, the first from the prompt's pass, then one pass each
    batch: int  # sequences generated at once
    vocabulary: int  # token ids, and the width of the logits
    precision: str = "fp32"  # a key of PRECISIONS

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def context(self) -> int:
        """The positions a sequence reaches: the cache and the position embeddings are this long."""
        return self.prompt + self.new_tokens


def decode_config(data: dict) -> DecodeConfig:
    """``data`` as a :class:`DecodeConfig`: every field present with its type, nothing else, every value in range."""
    cfg = DecodeConfig(**checked_fields(DecodeConfig, data, "decoding config"))
    if cfg.width % cfg.heads:
        raise OomLabError(f"The decoding config's width ({cfg.width}) must divide by its heads ({cfg.heads}).")
    if cfg.heads % cfg.kv_heads:
        raise OomLabError(
            f"The decoding config's heads ({cfg.heads}) must divide by its kv_heads ({cfg.kv_heads}): "
            "each key and value head serves the same number of query heads."
        )
    if cfg.precision not in PRECISIONS:
        raise OomLabError(f"The decoding config's precision must be one of {', '.join(PRECISIONS)}, not {cfg.precision!r}.")
    return cfg
