"""Estimate greedy generation's memory from its config alone: the reference answer.

The config names a decoder served with a KV cache (oomlab/sizing/decode.py:
embeddings, `layers` blocks of grouped-query attention and a 4x MLP, a head to the
vocabulary), the prompt, how many tokens are generated after it, for how many
sequences at once, and the dtype everything is kept and computed in. Every figure
is in bytes; C is the width, s the bytes of one value.

The generation: the cache is allocated whole, the prompt runs in one pass (the
prefill), its last position's logits pick the first new token, then each further
token runs a pass of its own, over one position, attending to every cached one.
"""

BYTES = {"fp32": 4, "bf16": 2}  # per weight, cached value and activation: nothing is kept in another dtype
ID = 8  # a token id is an int64


def kv_width(cfg):
    """The width of one token's keys (or values) in one layer: kv_heads heads of head_dim = width // heads."""
    return cfg["kv_heads"] * (cfg["width"] // cfg["heads"])


def weights(cfg):
    C, V, K = cfg["width"], cfg["vocabulary"], kv_width(cfg)
    # q and the output projection are C x C; k and v only C x K: grouped-query attention shrinks them too.
    matrices = C * C + 2 * C * K + C * C + 4 * C * C + 4 * C * C  # q, k, v, out, up, down
    vectors = 2 * C + (C + 2 * K + C + 4 * C + C) + 2 * C  # two LayerNorms, the six linears' biases
    positions = cfg["prompt"] + cfg["new_tokens"]  # the position table reaches the last generated token
    count = 2 * V * C + positions * C + cfg["layers"] * (matrices + vectors) + 2 * C  # the embedding, the head, the last norm
    return count * BYTES[cfg["precision"]]


def kv_cache(cfg):
    # Every layer keeps k and v for every position the generation will reach, for each sequence of the batch: the
    # cache grows with batch x (prompt + new_tokens), and is allocated that large before the first token is made.
    positions = cfg["prompt"] + cfg["new_tokens"]
    # Only the kv_heads heads are cached: grouped-query attention divides a multi-head cache by heads / kv_heads.
    return 2 * cfg["layers"] * cfg["batch"] * positions * kv_width(cfg) * BYTES[cfg["precision"]]


def one_pass(cfg, n, end):
    """What a pass over n tokens (of all the sequences together) allocates besides what stays, at each of three
    moments inside it; `end` is the number of positions its attention reads from the cache."""
    C, V, b, s = cfg["width"], cfg["vocabulary"], cfg["batch"], BYTES[cfg["precision"]]
    # 1. a block's MLP: the block's input (its caller holds it until the block returns), the residual after
    #    attention, the up projection (4C) and the GELU of it (4C), all at once.
    mlp = 10 * n * C * s
    # 2. a block's attention, at its output projection: the block's input, the LayerNorm's output, q, the attention's
    #    output and its projection (5 x C); and where 1 < kv_heads < heads, k and v copied out of the cache to all
    #    the heads over `end` positions, a multi-head cache's worth of this layer. (With kv_heads == heads there is
    #    nothing to repeat, and with kv_heads == 1 the one head is broadcast: both stay views of the cache.)
    #    No (n x end) scores: scaled_dot_product_attention runs a fused kernel, on the GPU flash or memory-efficient
    #    attention as the GPU decides by dtype and shape, on the CPU its flash kernel.
    copied = 1 < cfg["kv_heads"] < cfg["heads"]
    attention = 5 * n * C * s + (2 * b * end * C * s if copied else 0)
    # 3. the logits: the last hidden state and its LayerNorm over all n tokens, and the head's output for the last
    #    position of each sequence only (serving code slices before the head): batch x vocabulary, not n x vocabulary.
    logits = 2 * n * C * s + b * V * s
    return {"MLP": mlp, "attention": attention, "logits": logits}


def moments(cfg):
    """The moments that may hold the most: each one's bytes beside the weights, the whole cache and the prompt's ids."""
    b, P, T = cfg["batch"], cfg["prompt"], cfg["new_tokens"]
    # The prefill: every prompt token at once, over the cache filled to the prompt's end. Its MLP (10 x batch x
    # prompt x C) is the peak unless the prompt is short: then its logits may be, or a late token's attention. Its
    # attention never is: 7 x C per token at most, against the MLP's 10.
    candidates = {f"the prefill's {name}": size for name, size in one_pass(cfg, b * P, P).items()}
    if T > 1:
        # Of the passes over one new token each, the last holds the most: the most ids generated before it, and,
        # where 1 < kv_heads < heads, k and v of prompt + new_tokens - 1 positions copied to every head. That copy
        # outgrows the prefill's MLP when the generation runs about four times as long as the prompt, or longer.
        # (Each id is a tensor of its own, (batch, 1): on the GPU each takes a block of at least 512 bytes.)
        generated = b * (T - 1) * ID
        last = one_pass(cfg, b, P + T - 1)
        candidates.update({f"the last token's {name}": generated + size for name, size in last.items()})
    return candidates


def peak(cfg):
    at_rest = weights(cfg) + kv_cache(cfg) + cfg["batch"] * cfg["prompt"] * ID  # the prompt's ids stay to the end
    return at_rest + max(moments(cfg).values())


def estimate(cfg):
    return {"weights": weights(cfg), "kv_cache": kv_cache(cfg), "peak": peak(cfg)}


if __name__ == "__main__":
    example = dict(
        layers=32,
        width=4096,
        heads=32,
        kv_heads=8,
        prompt=4096,
        new_tokens=256,
        batch=8,
        vocabulary=32000,
        precision="bf16",
    )
    for part, size in estimate(example).items():
        print(f"{part:>9}: {size / 2**20:12,.1f} MiB")
    held = moments(example)
    print(f"the peak is at {max(held, key=held.get)}")
