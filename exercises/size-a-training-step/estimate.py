"""Size one training step from its config alone, before anything runs: your estimate, in bytes, of each part.

`oomlab check` calls estimate(config) for hidden configs, then runs each of them on the GPU and
compares every part with what the caching allocator measured: the bytes the step's tensors requested
(memory_stats' requested_bytes, before the allocator rounds them to its blocks) at each phase, and at
their peak. The estimate runs in a sandbox with no GPU and no
torch: it is arithmetic on the config. `oomlab run` shows your answers for the exercise's example
configs beside a count of the same step on the CPU.

The config is a dict:

    layers         transformer blocks
    width          the model's width (d_model); each block's MLP is 4 x width wide
    heads          attention heads (width divides by it)
    sequence       tokens per sample
    batch          samples per step
    vocabulary     token ids, and the width of the logits
    precision      "fp32": everything in fp32;
                   "bf16-autocast": fp32 weights, gradients and optimizer state, the forward pass under
                   torch.autocast in bfloat16;
                   "bf16": weights, gradients, optimizer state and activations all in bfloat16
    optimizer      "adamw", "sgd-momentum" (momentum=0.9), "sgd" (no momentum), "adafactor" (torch 2.5+)
    checkpointing  True: every block under torch.utils.checkpoint (non-reentrant)

The model is oomlab.sizing.model, shown on this exercise's page (`python -m inspect
oomlab.sizing.model` prints it): token embeddings (a row per token id) and position embeddings (a
row per position of the sequence), `layers` blocks (LayerNorm, causal self-attention through
F.scaled_dot_product_attention, LayerNorm, a GELU MLP; every Linear of a block has a bias), a final
LayerNorm, a head to the vocabulary without bias (not tied to the embedding), and cross-entropy.
Each part, as the grader reads it (the page shows how):

    parameters       what the model's weights take once built
    gradients        what .grad holds after backward()
    optimizer_state  what optimizer.step() keeps for the next step
    activations      what the forward pass leaves allocated for backward (saved tensors, logits, loss)
    peak             the most allocated at once during a step after the first (the optimizer state exists)

Every part is graded within a tolerance: 2% for parameters, gradients and optimizer state, 10% for
the activations, 15% for the peak.
"""


def parameter_count(config):
    """The classic GPT count: 12 x width^2 a block, and the embedding."""
    C = config["width"]
    return 12 * config["layers"] * C * C + config["vocabulary"] * C


def estimate(config):
    weights = 4 * parameter_count(config)  # four bytes a parameter
    return {
        "parameters": weights,
        "gradients": weights,
        "optimizer_state": 0,
        "activations": 0,
        "peak": weights,
    }


if __name__ == "__main__":
    example = dict(layers=12, width=768, heads=12, sequence=1024, batch=8, vocabulary=50304,
                   precision="bf16-autocast", optimizer="adamw", checkpointing=False)
    for part, size in estimate(example).items():
        print(f"{part:>16}: {size / 2**20:10,.1f} MiB")
