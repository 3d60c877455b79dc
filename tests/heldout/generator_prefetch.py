"""Held-out leak: a prefetching generator keeps every batch it has handed out.

The loader makes the next batch while the model trains on the current one, and
keeps the batches it yielded in a window "to replay the hard ones later"; the
replay was never written and the window never trimmed. Between two steps the
generator is suspended, and a suspended generator's frame keeps its locals:
expected holder main()'s local 'batches' (the generator), through its frame's
local 'window'.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 2048, 100
batch_size, steps = 16384, 60


def prefetch(steps, generator):
    window = []  # for a replay of hard examples, never trimmed
    upcoming = torch.randn(batch_size, d_in, device=device, generator=generator)
    for _ in range(steps):
        batch, upcoming = upcoming, torch.randn(batch_size, d_in, device=device, generator=generator)
        window.append(batch)
        yield batch


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator(device=device).manual_seed(0)
    batches = prefetch(steps, generator)
    for step, x in enumerate(batches):
        y = torch.randint(n_classes, (batch_size,), device=device, generator=generator)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


main()
