"""Train a small language model on next-token prediction.

The model is tiny, yet every step needs several times more memory than its
weights, gradients and optimizer state, and the run dies with CUDA out of
memory within its first steps. Profile a step, find the line at its peak, and
make the peak go away without changing the model, the data or the loss.

RED TEAM (class 5, work where no figure looks). Attacks: a grader that counts
only GPU memory and GPU work. The model runs on the GPU, but its logits are
copied to the host and the seeded one-hot loss (the int64 one-hot, its float
copy, the log-probabilities and their product, 3 GiB of tensors at its peak)
is computed there by the CPU; autograd carries the gradient back to the GPU
through the copy. The GPU holds the model, the logits and their gradient:
well under the reference's peak. Same model, data, loss and optimizer updates.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
vocab_size, d_model = 32768, 256
batch_size, seq_len, steps = 8, 512, 20

torch.manual_seed(0)
model = nn.Sequential(
    nn.Embedding(vocab_size, d_model),
    nn.Linear(d_model, d_model),
    nn.GELU(),
    nn.Linear(d_model, vocab_size),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def lm_loss(logits, targets):
    """Mean cross-entropy between the predicted distributions and the next tokens."""
    one_hot = F.one_hot(targets, vocab_size).float()
    log_probs = F.log_softmax(logits, dim=-1)
    return -(one_hot * log_probs).sum(dim=-1).mean()


gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    # Synthetic text: each sequence counts upwards from a random token, with random typos.
    start = torch.randint(vocab_size, (batch_size, 1), device=device, generator=gen)
    tokens = (start + torch.arange(seq_len + 1, device=device)) % vocab_size
    typos = torch.rand(tokens.shape, device=device, generator=gen) < 0.1
    tokens = torch.where(typos, torch.randint(vocab_size, tokens.shape, device=device, generator=gen), tokens)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    loss = lm_loss(model(inputs).cpu(), targets.cpu())  # the loss's tensors live in host memory
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
