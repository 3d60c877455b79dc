"""Held-out leak: a gradient hook keeps every step's gradient of the largest weight.

To plot how the gradient of the output layer evolves, the script registers a
hook on that weight that appends each gradient to a list in the hook's
closure. Only the hook refers to the list, and only the weight refers to the
hook (a tensor's hooks live on the tensor), so no name in the script leads to
the gradients. Expected holder: the model, through the weight's hooks and the
hook's closure.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_hidden, n_classes = 1024, 4096, 4096
batch_size, steps = 256, 60


def record_gradients(weight):
    history = []

    def keep(grad):
        history.append(grad)  # the gradient itself, 64 MiB each step: its norm was what the plot needed
        return grad

    weight.register_hook(keep)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
record_gradients(model[2].weight)
generator = torch.Generator(device=device).manual_seed(0)
for step in range(steps):
    x = torch.randn(batch_size, d_in, device=device, generator=generator)
    y = torch.randint(n_classes, (batch_size,), device=device, generator=generator)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.3f}")
