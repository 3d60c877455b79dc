"""Sizing greedy generation with a KV cache, on the CPU: the configs, the count of a real generation's bytes, and the
reference estimate against that count. The GPU's measurement (``python -m oomlab.sizing.decode``) is the truth an
estimate would be graded on; here the same generation is counted tensor by tensor."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from oomlab.errors import OomLabError
from oomlab.sizing.decode_config import DECODE_PARTS, DECODE_TOLERANCE, DecodeConfig, decode_config
from oomlab.sizing.score import PartScore
from tests.sizing_helpers import count_on_cpu, load

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "solutions" / "size-a-decoder" / "estimate.py"
SMALL = dict(layers=2, width=64, heads=4, kv_heads=2, prompt=16, new_tokens=4, batch=2, vocabulary=300, precision="fp32")


def reference():
    return load(REFERENCE, "reference_decode_estimate")


@functools.cache  # a config is counted once for the whole file: the count of one is the same every time
def counted(cfg: DecodeConfig) -> dict[str, int]:
    from oomlab.sizing.decode import decode_bytes

    return count_on_cpu(decode_bytes, cfg)


def within(part: str, estimated: float, measured: int) -> bool:
    return PartScore(part, estimated, measured, DECODE_TOLERANCE[part]).within


# -- configs ----------------------------------------------------------------------------------------------------------


def test_a_decoding_config_is_checked_field_by_field():
    assert decode_config(SMALL) == DecodeConfig(**SMALL)
    assert decode_config(SMALL).context == 20
    for bad, said in (
        ({**SMALL, "width": 66}, r"width \(66\) must divide by its heads \(4\)"),
        ({**SMALL, "kv_heads": 3}, r"heads \(4\) must divide by its kv_heads \(3\)"),
        ({**SMALL, "kv_heads": 0}, "kv_heads must be at least 1, not 0"),
        ({**SMALL, "new_tokens": 0}, "new_tokens must be at least 1"),
        ({**SMALL, "prompt": -1}, "prompt must be at least 1"),
        ({**SMALL, "batch": 2.0}, "batch must be a whole number, not 2.0"),
        ({**SMALL, "layers": True}, "layers must be a whole number, not True"),
        ({**SMALL, "precision": "bf16-autocast"}, "precision must be one of fp32, bf16, not 'bf16-autocast'"),
        ({**SMALL, "sequence": 32}, "has no field sequence"),
        ({k: v for k, v in SMALL.items() if k != "kv_heads"}, "lacks kv_heads"),
        ([1, 2], "not list"),
    ):
        with pytest.raises(OomLabError, match=said):
            decode_config(bad)


def test_the_config_and_the_reference_estimate_need_no_torch():
    """A learner's estimator and the drawing of configs run where torch may be absent."""
    probe = (
        "import runpy, sys\n"
        "from oomlab.sizing.decode_config import decode_config\n"
        f"cfg = decode_config({SMALL!r}).as_dict()\n"
        f"parts = runpy.run_path({str(REFERENCE)!r})['estimate'](cfg)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(sorted(parts))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(DECODE_PARTS))


# -- the generation, counted on the CPU -------------------------------------------------------------------------------


def test_the_counted_weights_and_cache_are_the_tensors_the_generation_holds():
    torch = pytest.importorskip("torch")
    from oomlab.sizing import decode

    cfg = decode_config(SMALL)
    parts = counted(cfg)
    model = decode.build(cfg, torch.device("cpu"))
    cache = decode.new_cache(cfg, torch.device("cpu"))
    assert parts["weights"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert parts["kv_cache"] == sum(t.numel() * t.element_size() for pair in cache for t in pair)
    assert {tuple(t.shape) for pair in cache for t in pair} == {(2, 2, 20, 16)}  # (batch, kv_heads, context, head_dim)
    assert parts["peak"] > parts["weights"] + parts["kv_cache"] + 8 * cfg.batch * cfg.prompt


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_each_query_head_attends_with_the_key_and_value_head_of_its_group(kv_heads):
    """The prompt's attention, against softmax attention written out head by head: query head i reads key and value
    head i // (heads // kv_heads), and no position sees a later one."""
    torch = pytest.importorskip("torch")
    from oomlab.sizing import decode

    cfg = decode_config({**SMALL, "kv_heads": kv_heads})
    b, t, head_dim, group = 2, 7, cfg.width // cfg.heads, cfg.heads // kv_heads
    torch.manual_seed(0)
    block = decode.Block(cfg)
    h = torch.randn(b, t, cfg.width)
    with torch.inference_mode():
        attended = block.attend(h, *decode.new_cache(cfg, torch.device("cpu"))[0], 0)
        q, k, v = (proj(h).view(b, t, -1, head_dim) for proj in (block.q, block.k, block.v))
        later = torch.ones(t, t, dtype=torch.bool).triu(1)
        heads = []
        for i in range(cfg.heads):
            scores = q[:, :, i] @ k[:, :, i // group].transpose(1, 2) / head_dim**0.5
            heads.append(scores.masked_fill(later, float("-inf")).softmax(dim=-1) @ v[:, :, i // group])
        torch.testing.assert_close(attended, block.out(torch.cat(heads, dim=-1)))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_the_cache_changes_what_generation_costs_not_what_it_computes(kv_heads):
    """Each pass over the cache gives the logits that a full pass over everything before it gives, with no cache to
    reuse (the cache's slices, the positions and the masks are right), and the generation
    picks the most likely token of each."""
    torch = pytest.importorskip("torch")
    from oomlab.sizing import decode

    cfg = decode_config({**SMALL, "kv_heads": kv_heads, "prompt": 5, "new_tokens": 6})
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = decode.build(cfg, cpu)
    prompt = decode.prompt_ids(cfg, cpu)
    tokens = decode.generate(model, decode.new_cache(cfg, cpu), prompt, cfg.new_tokens)
    assert tokens.shape == (cfg.batch, cfg.new_tokens)
    cache = decode.new_cache(cfg, cpu)
    with torch.inference_mode():
        for i in range(cfg.new_tokens):
            cached = model(prompt, cache, 0) if i == 0 else model(tokens[:, i - 1 : i], cache, cfg.prompt + i - 1)
            whole = model(torch.cat([prompt, tokens[:, :i]], dim=1), decode.new_cache(cfg, cpu), 0)
            torch.testing.assert_close(cached, whole, rtol=1e-5, atol=1e-5)
            assert torch.equal(cached.argmax(dim=-1), tokens[:, i]), i
    filled = [bool(k[:, :, p].any()) for k, _ in cache for p in range(cfg.context)]
    assert filled == ([True] * (cfg.context - 1) + [False]) * cfg.layers  # the last token picked is never run


def test_grouped_query_attention_divides_the_cache_by_heads_over_kv_heads():
    full = counted(decode_config({**SMALL, "kv_heads": 4}))
    for kv_heads in (2, 1):
        shared = counted(decode_config({**SMALL, "kv_heads": kv_heads}))
        assert full["kv_cache"] == shared["kv_cache"] * (4 // kv_heads)
        assert shared["weights"] < full["weights"]  # k and v project to fewer heads too


# -- the reference estimate against the count -------------------------------------------------------------------------

# Small enough to count in a fraction of a second each; narrow, with a small vocabulary or a wide batch, so that what a
# generation allocates besides its weights and cache is more of its peak than the peak's tolerance; and shaped so that each moment the
# estimate names is the peak of one of them at least: the prefill's MLP (a prompt of some length), the prefill's logits
# (a short prompt and a wide vocabulary), the last token's attention (grouped-query attention, generating many times
# the prompt's length).
CONFIGS = [
    dict(layers=2, width=64, heads=4, kv_heads=4, prompt=64, new_tokens=4, batch=4, vocabulary=256, precision="fp32"),
    dict(layers=2, width=64, heads=4, kv_heads=2, prompt=64, new_tokens=4, batch=4, vocabulary=256, precision="bf16"),
    dict(layers=2, width=64, heads=4, kv_heads=1, prompt=64, new_tokens=4, batch=4, vocabulary=256, precision="fp32"),
    dict(layers=1, width=32, heads=4, kv_heads=2, prompt=4, new_tokens=60, batch=4, vocabulary=256, precision="bf16"),
    dict(layers=1, width=16, heads=2, kv_heads=1, prompt=2, new_tokens=4, batch=8, vocabulary=4000, precision="fp32"),
    dict(layers=2, width=32, heads=4, kv_heads=2, prompt=1, new_tokens=40, batch=6, vocabulary=256, precision="fp32"),
    dict(layers=1, width=64, heads=8, kv_heads=8, prompt=128, new_tokens=2, batch=2, vocabulary=512, precision="bf16"),
    dict(layers=2, width=48, heads=6, kv_heads=2, prompt=32, new_tokens=8, batch=4, vocabulary=256, precision="bf16"),
    dict(layers=1, width=32, heads=8, kv_heads=1, prompt=16, new_tokens=1, batch=8, vocabulary=256, precision="fp32"),
    dict(layers=2, width=32, heads=2, kv_heads=2, prompt=48, new_tokens=8, batch=3, vocabulary=300, precision="bf16"),
    dict(layers=1, width=32, heads=4, kv_heads=2, prompt=8, new_tokens=56, batch=2, vocabulary=256, precision="fp32"),
    dict(layers=1, width=16, heads=4, kv_heads=4, prompt=2, new_tokens=8, batch=16, vocabulary=8000, precision="bf16"),
]


def test_the_reference_estimate_agrees_with_the_count():
    """Exactly for the weights and the cache (a dtype's size times a count), within the peak's tolerance for the peak
    (the count has no allocator rounding and no kernel's scratch; the GPU's measurement decides)."""
    pytest.importorskip("torch")
    ref = reference()
    peaks_at = set()
    for data in CONFIGS:
        cfg = decode_config(data)
        estimate, parts = ref.estimate(cfg.as_dict()), counted(cfg)
        assert estimate["weights"] == parts["weights"] and estimate["kv_cache"] == parts["kv_cache"], cfg
        assert within("peak", estimate["peak"], parts["peak"]), (cfg, estimate["peak"], parts["peak"])
        held = ref.moments(cfg.as_dict())
        peaks_at.add(max(held, key=held.get))
    assert {"the prefill's MLP", "the prefill's logits", "the last token's attention"} <= peaks_at
    assert {c["precision"] for c in CONFIGS} == {"fp32", "bf16"}
    assert {"heads", 2, 1} <= {"heads" if c["kv_heads"] == c["heads"] else c["kv_heads"] for c in CONFIGS}


def test_a_naive_estimate_is_outside_the_tolerances():
    """The weights for every part, a cache with a key and a value for every query head, or a peak with nothing but the
    weights and the cache: each right where it should be, and wrong where it leaves something out."""
    pytest.importorskip("torch")
    ref = reference()
    for data in CONFIGS:
        cfg = decode_config(data)
        parts = counted(cfg)
        weights_only = dict.fromkeys(DECODE_PARTS, float(ref.weights(data)))
        assert [p for p in DECODE_PARTS if within(p, weights_only[p], parts[p])] == ["weights"], cfg
        every_head = ref.kv_cache({**data, "kv_heads": data["heads"]})
        assert within("kv_cache", every_head, parts["kv_cache"]) == (cfg.kv_heads == cfg.heads), cfg
        at_rest = ref.weights(data) + ref.kv_cache(data) + 8 * cfg.batch * cfg.prompt
        assert not within("peak", at_rest, parts["peak"]), cfg


# -- the measuring child ----------------------------------------------------------------------------------------------


def test_a_rehearsal_takes_each_generations_code_paths_in_a_fraction_of_its_bytes():
    from oomlab.sizing.decode import decode_bytes, rehearsal
    from oomlab.sizing.hidden import hidden_decode_configs, rough_decode_bytes

    for cfg in hidden_decode_configs(b"any estimator"):
        small = rehearsal(cfg)
        assert decode_config(small.as_dict()) == small
        for path in ("precision", "width", "heads", "kv_heads"):
            assert getattr(small, path) == getattr(cfg, path)
        assert rough_decode_bytes(small) < rough_decode_bytes(cfg) / 2
    assert count_on_cpu(decode_bytes, rehearsal(DecodeConfig(**CONFIGS[1])))["peak"] > 0


def test_a_generation_never_lets_attention_build_a_cudnn_plan_per_length(monkeypatch):
    # cuDNN's attention builds an execution plan for each new shape, and a generation's cache grows by one position a
    # token: a first generation of 2,048 tokens spent minutes building plans on an H100. Every attention call of a
    # generation runs with cuDNN's kernel switched off and flash's on; outside it, the settings are as they were.
    import torch
    import torch.nn.functional as F

    from oomlab.sizing import decode

    seen = []

    def attention(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()))
        return real(*args, **kwargs)

    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", attention)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    cfg = DecodeConfig(**CONFIGS[1])
    device = torch.device("cpu")
    decode.generate(decode.build(cfg, device), decode.new_cache(cfg, device), decode.prompt_ids(cfg, device), 3)
    assert seen and set(seen) == {(False, True)}
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_the_decoding_child_refuses_a_bad_config_and_says_where_there_is_no_gpu():
    pytest.importorskip("torch")
    import torch

    bad = subprocess.run(
        [sys.executable, "-m", "oomlab.sizing.decode"],
        input=json.dumps([{**SMALL, "kv_heads": 3}]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "must divide by its kv_heads" in bad.stderr
    if torch.cuda.is_available():
        return  # with a GPU it would measure, which the truth check does
    done = subprocess.run(
        [sys.executable, "-m", "oomlab.sizing.decode"], input=json.dumps([SMALL]), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and json.loads(done.stdout) == {"error": "no CUDA device is visible to torch"}
