"""Size greedy generation with a KV cache from its config alone, before anything runs: your estimate, in bytes.

`oomlab check` calls estimate(config) for hidden configs, then runs each generation on the GPU and
compares every part with what the caching allocator measured. The estimate runs in a sandbox with
no GPU and no torch: it is arithmetic on the config. `oomlab run` shows your answers for the
exercise's example configs beside a count of the same generation on the CPU.

The config is a dict:

    layers      transformer blocks
    width       the model's width (d_model); each block's MLP is 4 x width wide
    heads       query heads; each head is width // heads wide
    kv_heads    key and value heads, each shared by heads // kv_heads query heads
                (kv_heads == heads: multi-head attention; 1: multi-query; between: grouped-query)
    prompt      tokens of the prompt, run in one forward pass (the prefill)
    new_tokens  tokens generated after it, greedily: the first from the prefill, then one pass each
    batch       sequences generated at once
    vocabulary  token ids, and the width of the logits
    precision   "fp32" or "bf16": weights, cache and activations all in that dtype

The model and the generation are oomlab.sizing.decode, shown on this exercise's page (`python -m
inspect oomlab.sizing.decode` prints it): token and position embeddings, `layers` blocks
(LayerNorm, attention with separate q, k and v projections over a cache, LayerNorm, a GELU MLP;
every Linear of a block has a bias), a final LayerNorm and a head without bias. Each part, as the
grader reads it (the page shows how):

    weights   what the model holds once built
    kv_cache  the keys and values of every layer for every position the generation reaches,
              allocated whole before the prompt runs
    peak      the most allocated at once during the whole generation (weights, cache and the
              prompt's token ids included)

Every part is graded within a tolerance: 2% for the weights and the cache, 15% for the peak.
"""


def parameter_count(config):
    """The classic GPT count: 12 x width^2 a block, and the embedding."""
    C = config["width"]
    return 12 * config["layers"] * C * C + config["vocabulary"] * C


def estimate(config):
    weights = 4 * parameter_count(config)  # four bytes a parameter
    kv_cache = 0
    return {"weights": weights, "kv_cache": kv_cache, "peak": weights + kv_cache}


if __name__ == "__main__":
    example = dict(layers=32, width=4096, heads=32, kv_heads=8, prompt=4096, new_tokens=256, batch=8,
                   vocabulary=32000, precision="bf16")
    for part, size in estimate(example).items():
        print(f"{part:>9}: {size / 2**20:12,.1f} MiB")
