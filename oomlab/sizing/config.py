"""A training configuration to size: what an estimate is given, and what a measured run is built from.

It is a plain dict on the way in and out (an estimator written by a learner takes a
dict, and a report stores one), checked here once: :func:`config` turns a dict into a
:class:`TrainConfig` or says which field is wrong.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields

from oomlab.errors import OomLabError

__all__ = ["OPTIMIZERS", "PRECISIONS", "TrainConfig", "checked_fields", "config"]

# How the weights are kept and the step computes:
PRECISIONS = {
    "fp32": "fp32 weights, gradients, optimizer state and activations",
    "bf16-autocast": "fp32 weights, gradients and optimizer state; the forward pass under torch.autocast in bfloat16 "
    "(mixed precision: the fp32 weights are the masters)",
    "bf16": "bfloat16 weights, gradients, optimizer state and activations (no fp32 copy anywhere)",
}
OPTIMIZERS = {
    "adamw": "torch.optim.AdamW with its defaults",
    "sgd-momentum": "torch.optim.SGD with momentum=0.9",
    "sgd": "torch.optim.SGD without momentum",
    "adafactor": "torch.optim.Adafactor with its defaults (torch 2.5 and newer)",
}


@dataclass(frozen=True)
class TrainConfig:
    """One training step of the course's decoder (:mod:`oomlab.sizing.model`)."""

    layers: int  # transformer blocks
    width: int  # the model's width (d_model); each block's MLP is 4x as wide
    heads: int  # attention heads; width must divide by it
    sequence: int  # tokens per sample
    batch: int  # samples per step
    vocabulary: int  # token ids, and the width of the logits
    precision: str = "fp32"  # a key of PRECISIONS
    optimizer: str = "adamw"  # a key of OPTIMIZERS
    checkpointing: bool = False  # every block under torch.utils.checkpoint (non-reentrant)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def tokens(self) -> int:
        return self.batch * self.sequence


def checked_fields(cls, data, what: str) -> dict:
    """The fields of dataclass ``cls`` in ``data``, each present (or defaulted) with its own type, and nothing else;
    ``what`` names the config in each message ("training config")."""
    if not isinstance(data, dict):
        raise OomLabError(f"A {what} is a table of fields, not {type(data).__name__}.")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise OomLabError(f"A {what} has no field {', '.join(unknown)}; its fields are {', '.join(names)}.")
    values = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING:
                raise OomLabError(f"The {what} lacks {f.name}.")
            continue
        value = data[f.name]
        want, kind = {"int": (int, "a whole number"), "str": (str, "a string"), "bool": (bool, "true or false")}[f.type]
        if type(value) is not want:  # bool is an int: say True where a count is meant, and it is refused
            raise OomLabError(f"The {what}'s {f.name} must be {kind}, not {value!r}.")
        if want is int and value < 1:
            raise OomLabError(f"The {what}'s {f.name} must be at least 1, not {value}.")
        values[f.name] = value
    return values


def config(data: dict) -> TrainConfig:
    """``data`` as a :class:`TrainConfig`: every field present with its type, nothing else, every value in range."""
    cfg = TrainConfig(**checked_fields(TrainConfig, data, "training config"))
    if cfg.width % cfg.heads:
        raise OomLabError(f"The training config's width ({cfg.width}) must divide by its heads ({cfg.heads}).")
    for name, known in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS)):
        if getattr(cfg, name) not in known:
            raise OomLabError(f"The training config's {name} must be one of {', '.join(known)}, not {getattr(cfg, name)!r}.")
    return cfg
