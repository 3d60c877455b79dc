"""Final weights compared tensor by tensor through the parent's digest (oomlab.measure.weights)."""

from __future__ import annotations

import numpy as np

from oomlab.measure import weights


def write(path, *tensors) -> list[list[int]]:
    with open(path, "wb") as f:
        for t in tensors:
            f.write(np.asarray(t, dtype=np.float32).tobytes())
    return [list(np.shape(t)) for t in tensors]


def test_the_same_weights_are_at_distance_zero_and_every_element_counts_in_the_norm(tmp_path):
    rng = np.random.default_rng(0)
    big, small = rng.standard_normal((300, 700)), rng.standard_normal(7)
    shapes = write(tmp_path / "a", big, small)
    a = weights.digest(tmp_path / "a", shapes)
    assert [t["shape"] for t in a["tensors"]] == [[300, 700], [7]]
    assert len(a["tensors"][0]["sample"]) == weights.SAMPLE and len(a["tensors"][1]["sample"]) == 7
    assert a["tensors"][0]["norm"] == np.float64(np.linalg.norm(big.astype(np.float32).astype(np.float64)))
    assert weights.compare(a, a) == (0.0, "")
    # One element changed outside the sampled places still moves the norm.
    sampled = set(np.random.default_rng([0, big.size]).choice(big.size, size=weights.SAMPLE, replace=False).tolist())
    spot = next(i for i in range(big.size) if i not in sampled)
    changed = big.copy().reshape(-1)
    changed[spot] += 50.0
    write(tmp_path / "b", changed.reshape(big.shape), small)
    distance, _ = weights.compare(weights.digest(tmp_path / "b", shapes), a)
    assert distance > 1e-3


def test_weights_that_did_not_train_alike_are_far_apart_and_a_file_that_does_not_match_says_so(tmp_path):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 64))
    shapes = write(tmp_path / "ref", ref)
    near = write(tmp_path / "near", ref * (1 + 1e-6))
    other = write(tmp_path / "other", ref + 0.05 * rng.standard_normal((64, 64)))
    digest = weights.digest(tmp_path / "ref", shapes)
    assert weights.compare(weights.digest(tmp_path / "near", near), digest)[0] < 1e-5
    assert weights.compare(weights.digest(tmp_path / "other", other), digest)[0] > 1e-2
    short = weights.digest(tmp_path / "ref", [[64, 65]])
    assert "error" in short and "bytes" in short["error"]
    assert weights.compare(short, digest) == (None, short["error"])
    nan = write(tmp_path / "nan", np.full((64, 64), np.nan))
    assert "NaN" in weights.compare(weights.digest(tmp_path / "nan", nan), digest)[1]
