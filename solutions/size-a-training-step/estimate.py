"""Estimate one training step's memory from its config alone: the reference answer.

The config names a decoder (oomlab/sizing/model.py: embeddings, `layers` blocks of
attention and a 4x MLP, a head to the vocabulary, cross-entropy), how it is kept
(`precision`), the optimizer, and whether blocks are checkpointed. Every figure is
in bytes; N is the number of tokens in the batch (batch x sequence), C the width.
"""

BYTES = {"fp32": 4, "bf16-autocast": 4, "bf16": 2}  # per weight, gradient and optimizer value
STATE_PER_WEIGHT = {"adamw": 2, "sgd-momentum": 1, "sgd": 0}  # AdamW: exp_avg and exp_avg_sq; SGD: the momentum


def matrices(cfg):
    """The shape of every weight matrix: the embeddings, each block's four linears, the head."""
    C, V = cfg["width"], cfg["vocabulary"]
    block = [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)]  # qkv, out, up, down
    return [(V, C), (cfg["sequence"], C)] + block * cfg["layers"] + [(V, C)]


def parameter_count(cfg):
    C = cfg["width"]
    vectors = cfg["layers"] * (4 * C + 3 * C + C + 4 * C + C) + 2 * C  # two LayerNorms and four biases a block, the last norm
    return sum(r * c for r, c in matrices(cfg)) + vectors


def optimizer_state(cfg, n, w):
    if cfg["optimizer"] in STATE_PER_WEIGHT:
        return STATE_PER_WEIGHT[cfg["optimizer"]] * n * w
    # Adafactor: one row and one column of second moments per matrix, a full one for each vector, no first moment.
    in_matrices = sum(r * c for r, c in matrices(cfg))
    return (sum(r + c for r, c in matrices(cfg)) + n - in_matrices) * w


def saved_per_block(cfg, N):
    """What one block's forward keeps for its backward."""
    C, H = cfg["width"], cfg["heads"]
    logsumexp = 4 * N * H  # the fused attention keeps one fp32 figure per head and token, never the scores
    if cfg["precision"] == "bf16-autocast":
        # fp32: the block's input and the residual after attention (LayerNorm's inputs) and their mean and rstd;
        # bf16: the LayerNorms' outputs cast for the linears, q|k|v, attention's output, the MLP's two 4C-wide tensors;
        # and a bf16 copy of each linear's weight, which the linear saves for backward (autocast made it).
        return 4 * (2 * N * C + 4 * N) + 2 * (14 * N * C) + logsumexp + 2 * 12 * C * C
    s = BYTES[cfg["precision"]]
    # the input and the residual, two LayerNorm outputs, q|k|v (3C), attention's output, the MLP's up and GELU (4C each)
    return s * (16 * N * C + 4 * N) + logsumexp


def saved_after_blocks(cfg, N):
    """The final LayerNorm, the head and the loss: log-softmax keeps its (N x vocabulary) output, in fp32 under autocast."""
    C, V = cfg["width"], cfg["vocabulary"]
    if cfg["precision"] == "bf16-autocast":
        return 4 * (N * C + 2 * N) + 2 * N * C + 2 * V * C + 4 * N * V
    s = BYTES[cfg["precision"]]
    return s * (2 * N * C + 2 * N + N * V)


def estimate(cfg):
    L, C, V = cfg["layers"], cfg["width"], cfg["vocabulary"]
    N = cfg["batch"] * cfg["sequence"]
    w = BYTES[cfg["precision"]]
    n = parameter_count(cfg)
    parameters = gradients = n * w
    state = optimizer_state(cfg, n, w)

    block = saved_per_block(cfg, N)
    block_input = (4 if cfg["precision"] == "bf16-autocast" else w) * N * C
    kept = block_input if cfg["checkpointing"] else block  # checkpointed, a block keeps its input and recomputes the rest
    activations = L * kept + saved_after_blocks(cfg, N) + 8 * cfg["sequence"]  # + the positions' int64 ids

    # The peak, after the first step (the optimizer state exists), is the largest of four moments:
    batch = 2 * 8 * N  # int64 tokens and targets
    at_rest = parameters + state + batch
    s = 2 if cfg["precision"] == "bf16" else 4
    in_flight = 2 * N * 4 * C * (2 if cfg["precision"] != "fp32" else 4)  # a block's backward: two 4C-wide gradients
    moments = [
        # 1. the loss's backward: two (N x V) gradients beside everything the forward saved
        at_rest + activations + 2 * s * N * V,
        # 2. the top block's backward: the blocks below still saved, this one whole (recomputed if checkpointed)
        at_rest + (L - 1) * kept + block + V * C * w + in_flight,
        # 3. the bottom block's backward: nearly every gradient made, one block's activations left
        at_rest + block + V * C * w + (L - 1) * (parameter_count({**cfg, "layers": 1}) - parameter_count({**cfg, "layers": 0})) * w + in_flight,
        # 4. the optimizer's step: every gradient, and the step's temporaries (foreach AdamW: one per weight;
        #    Adafactor, one tensor at a time: about one of the largest)
        at_rest + gradients + (n * w if cfg["optimizer"] == "adamw" else max(V, 4 * C) * C * w if cfg["optimizer"] == "adafactor" else 0),
    ]
    return {"parameters": parameters, "gradients": gradients, "optimizer_state": state, "activations": activations, "peak": max(moments)}


if __name__ == "__main__":
    example = dict(layers=12, width=768, heads=12, sequence=1024, batch=8, vocabulary=50304,
                   precision="bf16-autocast", optimizer="adamw", checkpointing=False)
    for part, size in estimate(example).items():
        print(f"{part:>16}: {size / 2**20:10,.1f} MiB")
