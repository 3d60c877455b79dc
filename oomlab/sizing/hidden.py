"""The configs an estimate is graded on: drawn from the learner's own code, so they are hidden and yet repeatable.

An estimator tuned to a list of configs it could read would learn the list, not
the rules. The configs are drawn when the estimator is graded, from a space of
decoder shapes a single GPU trains (:data:`SPACE`), with a random generator seeded
by a hash of the estimator's source: the same code is graded on the same configs,
so it gets the same verdict every time (the measured bytes of a config do not move
between runs on one machine), and any change to the code draws new ones. Every
precision and every optimizer comes up, and half of the configs checkpoint.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

from oomlab.sizing.config import OPTIMIZERS, PRECISIONS, TrainConfig

__all__ = ["COUNT", "SPACE", "hidden_configs"]

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
MOST_BYTES = 24 << 30  # a generous bound on a config's step, so that none needs more than a share of one GPU


def rough_bytes(cfg: TrainConfig) -> int:
    """An upper bound on a step's bytes, far above any good estimate: only to keep the drawn configs small enough."""
    width, tokens = cfg.width, cfg.tokens
    parameters = cfg.layers * 13 * width * width + 2 * cfg.vocabulary * width + cfg.sequence * width
    return 24 * parameters + cfg.layers * 80 * tokens * width + 16 * tokens * cfg.vocabulary


def hidden_configs(source: bytes, optimizers: Iterable[str] = OPTIMIZERS, count: int = COUNT) -> list[TrainConfig]:
    """``count`` configs for the estimator whose source is ``source``, with only the ``optimizers`` this torch has."""
    rng = random.Random(hashlib.sha256(b"oomlab-sizing\0" + source).digest())
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
