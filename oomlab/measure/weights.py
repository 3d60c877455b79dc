"""Final weights, compared tensor by tensor by the trusted parent, without keeping them.

A memory fix must train the same model to the same weights. The measuring
child writes its optimizers' parameters, in order, as float32, to a file it
opened before its sandbox closed the folder (:mod:`oomlab.measure.child`);
the parent reads it here and keeps a **digest** per tensor: its shape, its
norm and sum over every element (float64), and its values at
:data:`SAMPLE` positions drawn from a generator seeded by the tensor's
place and size, the same positions in every run. Two runs are then compared
tensor by tensor (:func:`compare`): the relative distance between their
sampled values, and between their norms.

Why this is enough: a script that did not train as the reference does cannot
know the reference's values (the reference's digest lives in the course's
``.oomlab/``, out of the sandbox's reach), so it cannot put the right numbers
at the sampled places; and every element counts in the norm and the sum.
Why not the whole tensors: a model of 67 million parameters is 268 MB a run,
for a class of fifty; the digest is a few kilobytes.

numpy is there wherever oomlab is (matplotlib needs it); it is imported only here.
"""

from __future__ import annotations

import math
import os

__all__ = ["SAMPLE", "compare", "digest"]

SAMPLE = 512
_CHUNK = 1 << 22  # elements summed at a time: a float64 copy of a chunk, never of the whole tensor


def digest(path: str | os.PathLike, shapes: list[list[int]]) -> dict:
    """The digest of the weights file at ``path``, whose tensors have ``shapes``; ``{"error"}`` when the file does not match."""
    import numpy as np

    counts = [math.prod(shape) for shape in shapes]
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return {"error": f"the weights file cannot be read: {err.strerror or err}"}
    if size != 4 * sum(counts):
        return {
            "error": f"the weights file holds {size:,} bytes; {len(shapes)} float32 tensors of these shapes take {4 * sum(counts):,}"
        }
    if not counts:
        return {"tensors": []}
    data = np.memmap(path, dtype=np.float32, mode="r")
    tensors, offset = [], 0
    for i, (shape, n) in enumerate(zip(shapes, counts, strict=True)):
        t = data[offset : offset + n]
        offset += n
        total, squares = 0.0, 0.0
        for start in range(0, n, _CHUNK):
            chunk = np.asarray(t[start : start + _CHUNK], dtype=np.float64)
            total += float(chunk.sum())
            squares += float(np.dot(chunk, chunk))
        where = _positions(n, i)
        tensors.append(
            {
                "shape": list(shape),
                "sum": total,
                "norm": math.sqrt(squares),
                "finite": bool(math.isfinite(total) and math.isfinite(squares)),
                "sample": [float(v) for v in np.asarray(t[where], dtype=np.float64)],
            }
        )
    del data
    return {"tensors": tensors}


def _positions(n: int, index: int):
    """The sampled positions of the ``index``-th tensor of ``n`` elements: the same in every run."""
    import numpy as np

    if n <= SAMPLE:
        return np.arange(n)
    return np.sort(np.random.default_rng([index, n]).choice(n, size=SAMPLE, replace=False))


def compare(mine: dict | None, ref: dict | None) -> tuple[float | None, str]:
    """The largest relative distance over the tensors (sampled values, and norms), and what differs when they cannot be compared.

    Returns ``(distance, "")`` or ``(None, why)``. The relative distance of a
    tensor is ``|a - b| / |b|`` over its sampled values (``|b|`` floored at
    1e-12), and likewise for its norm; a tensor that is all zeros in both is at 0.
    """
    if not mine or "tensors" not in mine:
        return None, (mine or {}).get("error", "no final weights were recorded")
    if not ref or "tensors" not in ref:
        return None, "the reference recorded no final weights"
    a, b = mine["tensors"], ref["tensors"]
    if len(a) != len(b):
        return None, f"the optimizer holds {len(a)} tensors; the reference's holds {len(b)}"
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x["shape"] != y["shape"]:
            return None, f"tensor {i + 1} has shape {tuple(x['shape'])}; the reference's has {tuple(y['shape'])}"
        if not x.get("finite", True):
            return None, f"tensor {i + 1} holds NaN or infinite values"
        diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(x["sample"], y["sample"], strict=True)))
        scale = math.sqrt(sum(q * q for q in y["sample"]))
        worst = max(worst, diff / max(scale, 1e-12) if diff else 0.0)
        worst = max(worst, abs(x["norm"] - y["norm"]) / max(y["norm"], 1e-12) if x["norm"] != y["norm"] else 0.0)
    return worst, ""
