"""Train a 32,768-way classifier for a few steps, then measure it on a held-out set.

Evaluation runs under torch.no_grad(), and training fits the memory budget
with room to spare, yet the run dies with CUDA out of memory during the
evaluation. Find what the evaluation keeps, and fix that, without changing
what the script trains, what it evaluates, or the metrics it prints.

RED TEAM (class 5, work or memory where no figure looks). The evaluation
keeps every batch's full logits, as the bug does, and concatenates them at the
end, but on the CPU: evaluate() runs a host copy of the trained model on each
held-out batch (drawn on the GPU from the same generator, then moved), so the
2 GiB of logits, their concatenation and the softmax over all of them are host
memory. The GPU holds what training needs: no OOM, the training step's peak,
the same training, and metrics equal to the CPU's rounding.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 256, 1024, 32_768  # as many classes as a small language model has tokens
batch_size, steps, eval_batches = 1024, 20, 16

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device) / d_in**0.5  # labels come from a fixed random teacher
prior = -0.5 * torch.arange(1, n_classes + 1, device=device).log()  # a few classes are common, most are rare


def get_batch(gen):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).add_(prior).argmax(dim=1)


model = nn.Sequential(
    nn.Linear(d_in, d_hidden),
    nn.GELU(),
    nn.Linear(d_hidden, d_hidden),
    nn.GELU(),
    nn.Linear(d_hidden, n_classes),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def calibration_error(confidence, correct, n_bins=15):
    """Expected calibration error: the gap between confidence and accuracy, bin by bin, weighted by the bins' sizes."""
    bins = (confidence * n_bins).long().clamp(max=n_bins - 1)
    gap = torch.bincount(bins, weights=confidence - correct.float(), minlength=n_bins)
    return (gap.abs().sum() / len(confidence)).item()


@torch.no_grad()
def evaluate():
    host_model = copy.deepcopy(model).cpu().eval()  # the evaluation runs in host memory
    gen = torch.Generator(device=device).manual_seed(1234)  # the same held-out set every time
    all_logits, all_labels = [], []
    for _ in range(eval_batches):
        x, y = get_batch(gen)
        all_logits.append(host_model(x.cpu()))  # the metrics are computed over the whole set at the end
        all_labels.append(y.cpu())
    logits, labels = torch.cat(all_logits), torch.cat(all_labels)
    loss = F.cross_entropy(logits, labels)
    confidence, predicted = logits.softmax(dim=1).max(dim=1)
    correct = predicted == labels
    top5 = (logits.topk(5, dim=1).indices == labels[:, None]).any(dim=1)
    return loss.item(), correct.float().mean().item(), top5.float().mean().item(), calibration_error(confidence, correct)


train_gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(train_gen)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % 5 == 0:
        print(f"step {step:3d}  train loss {loss.item():.4f}")

loss, accuracy, top5, ece = evaluate()
print(f"held-out  loss {loss:.4f}  accuracy {accuracy:.4f}  top-5 {top5:.4f}  ECE {ece:.6f}")
