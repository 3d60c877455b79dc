"""Train a small language model on next-token prediction.

The model is tiny, yet every step needs several times more memory than its
weights, gradients and optimizer state, and the run dies with CUDA out of
memory within its first steps. Profile a step, find the line at its peak, and
make the peak go away without changing the model, the data or the loss.

HONEST FIX. The one-hot product picks one log-probability per position and
multiplies the other 32,767 by zero. gather() picks it directly: no int64
one-hot, no float copy of it, no (tokens x vocab) product, and nothing for
autograd to save but the log-probabilities and the indices. The same loss,
term for term, in one forward and one backward per step.
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
    log_probs = F.log_softmax(logits, dim=-1)
    return -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean()  # the target's log-probability, picked


gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    # Synthetic text: each sequence counts upwards from a random token, with random typos.
    start = torch.randint(vocab_size, (batch_size, 1), device=device, generator=gen)
    tokens = (start + torch.arange(seq_len + 1, device=device)) % vocab_size
    typos = torch.rand(tokens.shape, device=device, generator=gen) < 0.1
    tokens = torch.where(typos, torch.randint(vocab_size, tokens.shape, device=device, generator=gen), tokens)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    loss = lm_loss(model(inputs), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}")
