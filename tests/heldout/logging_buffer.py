"""Held-out leak: a logging MemoryHandler keeps every validation loss, and with it the loss's autograd graph.

The script logs each validation batch's loss at DEBUG level through a logger
whose MemoryHandler buffers records until an ERROR arrives. A LogRecord keeps
its arguments unformatted, so each record keeps the loss tensor itself; and
validation runs without torch.no_grad(), so each loss keeps the activations
its forward pass saved. Expected holder: log.handlers[0].buffer[i].args[2].
"""

import logging
import logging.handlers

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 4096, 1000
batch_size, steps, val_batches = 1024, 40, 4

log = logging.getLogger("heldout.validation")
log.setLevel(logging.DEBUG)
log.propagate = False
log.addHandler(logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.ERROR, target=logging.NullHandler()))

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(d_in, d_hidden),
    nn.GELU(),
    nn.Linear(d_hidden, d_hidden),
    nn.GELU(),
    nn.Linear(d_hidden, n_classes),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
teacher = torch.randn(d_in, n_classes, device=device)
gen = torch.Generator(device=device).manual_seed(0)


def batch():
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


for step in range(1, steps + 1):
    x, y = batch()
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()

    model.eval()
    for i in range(val_batches):
        vx, vy = batch()
        val_loss = F.cross_entropy(model(vx), vy)
        log.debug("step %d batch %d loss %s", step, i, val_loss)
    model.train()
