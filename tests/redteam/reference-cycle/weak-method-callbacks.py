"""Train a small language model with step-end callbacks for logging and metrics.

Each step's batch and results travel in a StepState object; when the step ends,
its callbacks read what they need from it. The loop turns Python's garbage
collector off, as many training frameworks do, because its pauses made step
times uneven. Memory now grows by the same amount every step until the run dies
with CUDA out of memory, although each step's state is replaced by the next
one's. Find what keeps the old steps alive, and fix it without changing what the
script trains or reports.

HONEST FIX. The callbacks list kept bound methods, each holding the state
that holds the list: a cycle that only the (disabled) collector could free.
Here the list holds weakref.WeakMethod references, which do not keep the state
alive; each is dereferenced when the step ends. With no cycle, reference
counting frees the old state, logits and all, as soon as the next step
replaces it. The collector stays off; the same training and log.
"""

import gc
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
vocab_size, d_model = 8192, 512
batch_size, seq_len, steps = 8, 256, 30


class StepState:
    """One step's batch and results, and the callbacks that read them when the step ends."""

    def __init__(self, step, inputs, targets):
        self.step, self.inputs, self.targets = step, inputs, targets
        self.logits = self.loss = None
        self.metrics = {}
        self.callbacks = [weakref.WeakMethod(self.record_loss), weakref.WeakMethod(self.record_accuracy)]  # no cycle

    def record_loss(self):
        self.metrics["loss"] = self.loss.item()

    def record_accuracy(self):
        self.metrics["accuracy"] = (self.logits.argmax(dim=-1) == self.targets).float().mean().item()

    def end(self):
        for callback in self.callbacks:
            callback()()
        return self.metrics


torch.manual_seed(0)
model = nn.Sequential(
    nn.Embedding(vocab_size, d_model),
    nn.Linear(d_model, 4 * d_model),
    nn.GELU(),
    nn.Linear(4 * d_model, d_model),
    nn.Linear(d_model, vocab_size),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def get_batch(gen):
    """Synthetic text: each sequence counts upwards from a random token, with random typos."""
    start = torch.randint(vocab_size, (batch_size, 1), device=device, generator=gen)
    tokens = (start + torch.arange(seq_len + 1, device=device)) % vocab_size
    typos = torch.rand(tokens.shape, device=device, generator=gen) < 0.1
    tokens = torch.where(typos, torch.randint(vocab_size, tokens.shape, device=device, generator=gen), tokens)
    return tokens[:, :-1], tokens[:, 1:]


gc.disable()  # collection pauses made step times uneven; each step's objects go when the next step replaces them
gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    inputs, targets = get_batch(gen)
    state = StepState(step, inputs, targets)
    state.logits = model(inputs)
    state.loss = F.cross_entropy(state.logits.flatten(0, 1), targets.flatten())
    optimizer.zero_grad(set_to_none=True)
    state.loss.backward()
    optimizer.step()
    metrics = state.end()
    if step % 5 == 0:
        print(f"step {step:3d}  loss {metrics['loss']:.4f}  accuracy {metrics['accuracy']:.3f}")
