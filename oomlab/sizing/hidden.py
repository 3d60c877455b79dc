"""The configs an estimate is graded on: drawn from the learner's own code, so they are hidden and yet repeatable.

An estimator tuned to a list of configs it could read would learn the list, not
the rules. The configs are drawn when the estimator is graded, from a space of
decoder shapes a single GPU trains (:data:`SPACE`), with a random generator seeded
by a hash of the estimator's source and of the modules beside it that it may import
(:func:`oomlab.sizing.grade.estimator_source`): the same code is graded on the same
configs, so it gets the same verdict every time (the measured bytes of a config do
not move between runs on one machine), and any change to the code draws new ones.
Every precision and every optimizer comes up, and half of the configs checkpoint.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

from oomlab.sizing.config import OPTIMIZERS, PRECISIONS, TrainConfig
from oomlab.sizing.decode_config import PRECISIONS as DECODE_PRECISIONS
from oomlab.sizing.decode_config import DecodeConfig

__all__ = ["COUNT", "DECODE_SPACE", "SPACE", "hidden_configs", "hidden_decode_configs"]

COUNT = 6  # configs per grading
SPACE = {
    "layers": range(2, 13),
    "head_width": (64, 128),  # the width is heads x head_width
    "heads": (4, 8, 16),
    "sequence": (256, 512, 1024, 2048),
    "batch": (1, 2, 4, 8),
    "vocabulary": (8192, 16384, 32000, 50304),
}
MOST_TOKENS = 8192  # batch x sequence
MOST_BYTES = 8 << 30  # a generous bound on a config's bytes (actual ones stay well under): no more than an exercise's budget


def rough_parameters(layers: int, width: int, vocabulary: int, positions: int) -> int:
    """More parameters than the decoder has: 13 width x width per block, the embedding and the head, the positions."""
    return layers * 13 * width * width + 2 * vocabulary * width + positions * width


def rough_bytes(cfg: TrainConfig) -> int:
    """An upper bound on a step's bytes, far above any good estimate: only to keep the drawn configs small enough."""
    width, tokens = cfg.width, cfg.tokens
    parameters = rough_parameters(cfg.layers, width, cfg.vocabulary, cfg.sequence)
    return 24 * parameters + cfg.layers * 80 * tokens * width + 16 * tokens * cfg.vocabulary


def _seeded(source: bytes, kind: bytes) -> random.Random:
    return random.Random(hashlib.sha256(b"oomlab-sizing\0" + kind + b"\0" + source).digest())


def hidden_configs(source: bytes, optimizers: Iterable[str] = OPTIMIZERS, count: int = COUNT) -> list[TrainConfig]:
    """``count`` configs for the estimator whose source is ``source``, with only the ``optimizers`` this torch has."""
    rng = _seeded(source, b"train")
    optimizers = [o for o in OPTIMIZERS if o in set(optimizers)]
    precisions = list(PRECISIONS)
    # Each precision and optimizer in turn, in an order of the seed's choosing; checkpointing every other config.
    rng.shuffle(precisions)
    rng.shuffle(optimizers)
    checkpointing = [i % 2 == 1 for i in range(count)]
    rng.shuffle(checkpointing)
    configs = []
    while len(configs) < count:
        i = len(configs)
        heads = rng.choice(SPACE["heads"])
        cfg = TrainConfig(
            layers=rng.choice(SPACE["layers"]),
            width=heads * rng.choice(SPACE["head_width"]),
            heads=heads,
            sequence=rng.choice(SPACE["sequence"]),
            batch=rng.choice(SPACE["batch"]),
            vocabulary=rng.choice(SPACE["vocabulary"]),
            precision=precisions[i % len(precisions)],
            optimizer=optimizers[i % len(optimizers)],
            checkpointing=checkpointing[i],
        )
        if cfg.tokens <= MOST_TOKENS and rough_bytes(cfg) <= MOST_BYTES:
            configs.append(cfg)
    return configs


DECODE_SPACE = {
    "layers": range(2, 17),
    "head_width": (64, 128),
    "heads": (8, 16, 32),
    "groups": (1, 2, 4, 8),  # query heads per key and value head; 1: none shared (multi-head attention)
    "prompt": (16, 128, 512, 2048, 4096),
    "new_tokens": (16, 128, 512, 2048),
    "batch": (1, 2, 4, 8, 16),
    "vocabulary": (8192, 32000, 50304),
}


def rough_decode_bytes(cfg: DecodeConfig) -> int:
    """An upper bound on a generation's bytes, far above any good estimate: only to keep the drawn configs small."""
    width, s = cfg.width, 4 if cfg.precision == "fp32" else 2
    weights = rough_parameters(cfg.layers, width, cfg.vocabulary, cfg.context)
    return s * (weights + 4 * cfg.layers * cfg.batch * cfg.context * width + 12 * cfg.batch * cfg.context * width)


def hidden_decode_configs(source: bytes, count: int = COUNT) -> list[DecodeConfig]:
    """``count`` generation configs for the estimator whose source is ``source``: both precisions in turn, and
    multi-head, grouped and multi-query attention among them."""
    rng = _seeded(source, b"decode")
    precisions = list(DECODE_PRECISIONS)
    rng.shuffle(precisions)
    configs = []
    while len(configs) < count:
        heads = rng.choice(DECODE_SPACE["heads"])
        group = rng.choice(DECODE_SPACE["groups"])
        if len(configs) < 3:  # the first three: multi-query, grouped and multi-head attention, whatever the draw
            group = (heads, 4, 1)[len(configs)]
        cfg = DecodeConfig(
            layers=rng.choice(DECODE_SPACE["layers"]),
            width=heads * rng.choice(DECODE_SPACE["head_width"]),
            heads=heads,
            kv_heads=heads // group,
            prompt=rng.choice(DECODE_SPACE["prompt"]),
            new_tokens=rng.choice(DECODE_SPACE["new_tokens"]),
            batch=rng.choice(DECODE_SPACE["batch"]),
            vocabulary=rng.choice(DECODE_SPACE["vocabulary"]),
            precision=precisions[len(configs) % len(precisions)],
        )
        if rough_decode_bytes(cfg) <= MOST_BYTES:
            configs.append(cfg)
    return configs
