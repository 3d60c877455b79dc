"""Train a small language model on batches packed by document length.

Almost every batch holds 8 sequences of 1024 tokens, but now and then one comes
from the bucket of long documents, twice as long, and that one does not fit the
memory budget. The loop is built to survive it: it catches the out-of-memory
error and retries the batch as two halves accumulated into the same optimizer
step. Each half is no bigger than an ordinary batch, yet the retry runs out of
memory too. Find what holds the memory while the retry runs, and fix it without
changing what the script trains.

HONEST FIX. A batch longer than the ordinary ones is known to be too big
before it is tried: its shape says so. Such a batch is trained at once as the
two halves the retry would have used, each loss weighted 1/2, into the same
optimizer step; no attempt fails, so no exception (and no traceback holding
the failed attempt's activations) exists while the halves run. The handler
stays for any other batch that runs out of memory. Same samples per step,
same data, same losses and updates.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
vocab_size, d_model = 8192, 512
batch_size, seq_len, long_seq_len, steps = 8, 1024, 2048, 24
long_batches = {16}  # the steps whose batch comes from the long-document bucket

torch.manual_seed(0)
model = nn.Sequential(
    nn.Embedding(vocab_size, d_model),
    nn.Linear(d_model, 4 * d_model),
    nn.GELU(),
    nn.Linear(4 * d_model, d_model),
    nn.Linear(d_model, 4 * d_model),
    nn.GELU(),
    nn.Linear(4 * d_model, d_model),
    nn.Linear(d_model, vocab_size),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def get_batch(gen, length):
    """Synthetic text: each sequence counts upwards from a random token, with random typos."""
    start = torch.randint(vocab_size, (batch_size, 1), device=device, generator=gen)
    tokens = (start + torch.arange(length + 1, device=device)) % vocab_size
    typos = torch.rand(tokens.shape, device=device, generator=gen) < 0.1
    tokens = torch.where(typos, torch.randint(vocab_size, tokens.shape, device=device, generator=gen), tokens)
    return tokens[:, :-1], tokens[:, 1:]


def train_step(inputs, targets, scale=1.0):
    """Forward and backward on a batch or part of one; gradients accumulate. Returns the scaled loss."""
    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()) * scale
    loss.backward()
    return loss.item()


gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    inputs, targets = get_batch(gen, long_seq_len if step in long_batches else seq_len)
    optimizer.zero_grad(set_to_none=True)
    if inputs.shape[1] > seq_len:  # a long-document batch: twice an ordinary one, known not to fit in one pass
        half = batch_size // 2
        loss = train_step(inputs[:half], targets[:half], 0.5) + train_step(inputs[half:], targets[half:], 0.5)
        optimizer.step()
        if step % 4 == 0:
            print(f"step {step:3d}  loss {loss:.4f}")
        continue
    try:
        loss = train_step(inputs, targets)
    except torch.cuda.OutOfMemoryError as err:
        # Too big for one pass: run the two halves of the batch, each weighted 1/2, into the same step.
        print(f"step {step:3d}  {tuple(inputs.shape)} batch: {str(err).split('.')[0]}; retrying in halves")
        optimizer.zero_grad(set_to_none=True)  # drop any gradient the failed attempt left behind
        half = batch_size // 2
        loss = train_step(inputs[:half], targets[:half], 0.5) + train_step(inputs[half:], targets[half:], 0.5)
    optimizer.step()
    if step % 4 == 0:
        print(f"step {step:3d}  loss {loss:.4f}")
