"""Train a wide MLP, then find how far it can be pruned before it gets worse.

The script trains the model briefly in bf16 mixed precision, then makes one
pruned copy of it per sparsity level and evaluates each copy, in bf16 too, on
the same held-out batches, printing its loss and accuracy. Training fits the
memory budget with room to spare, and so does evaluating one copy; yet the
sweep dies with CUDA out of memory a copy or two in. Find what the finished
copies leave behind and why, and fix it without changing the model, the data,
the sparsities or the bf16 evaluation.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 8192, 10
batch_size, train_steps, eval_batches = 1024, 20, 4
sparsities = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


def get_batch(gen):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


with torch.device(device):  # built directly on the GPU
    model = nn.Sequential(
        nn.Linear(d_in, d_hidden),
        nn.GELU(),
        nn.Linear(d_hidden, d_hidden),
        nn.GELU(),
        nn.Linear(d_hidden, d_hidden),
        nn.GELU(),
        nn.Linear(d_hidden, n_classes),
    )
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

# 1. Train in mixed precision: fp32 weights, bf16 matrix products.
train_gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, train_steps + 1):
    x, y = get_batch(train_gen)
    with torch.autocast(device, dtype=torch.bfloat16):
        # The loss from fp32 logits: given bf16 logits, CUDA autocast computes cross_entropy's
        # log-softmax in bf16 (CPU autocast computes it in fp32).
        loss = F.cross_entropy(model(x).float(), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  train loss {loss.item():.4f}")

# 2. Prune copies of the trained model, one per sparsity, and evaluate each on the same held-out batches.
eval_gen = torch.Generator(device=device).manual_seed(1234)
held_out = [get_batch(eval_gen) for _ in range(eval_batches)]


@torch.no_grad()
def evaluate_pruned(sparsity):
    candidate = copy.deepcopy(model)  # the trained model itself stays as it is
    for layer in candidate:
        if isinstance(layer, nn.Linear) and sparsity > 0:
            # Magnitude pruning: each neuron keeps the largest (1 - sparsity) of its input weights.
            w = layer.weight
            threshold = w.abs().kthvalue(int(sparsity * w.shape[1]), dim=1, keepdim=True).values
            w.mul_(w.abs() > threshold)
    loss_sum, correct = 0.0, 0
    for x, y in held_out:
        # Autocast around the forward only, as in training. Inside a region, autocast caches the bf16 cast of
        # every fp32 weight that requires grad, no_grad or not, and (torch with pytorch/pytorch#165068) the cast's
        # autograd link keeps the weight itself; the cache is cleared only when the outermost region exits. One region around the sweep kept
        # every finished copy's casts and fp32 weights: 6 bytes a parameter, 817 MiB a copy.
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = candidate(x).float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(dim=1) == y).sum().item()
    n = eval_batches * batch_size
    return loss_sum / n, correct / n


for sparsity in sparsities:
    val_loss, accuracy = evaluate_pruned(sparsity)
    print(f"sparsity {sparsity:.1f}  val loss {val_loss:.4f}  accuracy {accuracy:.4f}")
