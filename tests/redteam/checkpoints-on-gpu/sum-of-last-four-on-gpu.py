"""Train a residual MLP and finish with the average of its last checkpoints.

The script evaluates on held-out data every few steps and keeps the weights of
each evaluation, so that at the end it can load the average of the last few and
see whether it beats every one of them. The training step alone fits the budget
with room to spare, yet the run dies with CUDA out of memory part-way through
training. The memory it prints at each evaluation is a clue. Make it fit without
changing the training, the evaluations or the averaged model it ends with.

HONEST FIX. Only the average of the last four checkpoints is ever used, and
the number of evaluations is known in advance. So instead of a copy of every
checkpoint, one running sum of the weights is kept on the GPU, started at the
fourth-last evaluation: one extra copy of the model instead of eight. At the
end the model loads the sum divided by four. The same training, the same
evaluations, the same averaged model (up to the order of four additions).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_model, d_hidden, n_blocks, n_classes = 512, 2048, 8192, 2, 100
batch_size, steps, eval_every, eval_batches, average_last = 1024, 40, 5, 4, 4

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


def get_batch(gen):
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


model = ResidualMLP().to(device)
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params / 1e6:.1f}M parameters, {n_params * 4 / 2**20:.0f} MiB of fp32 weights")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


@torch.no_grad()
def evaluate():
    model.eval()
    gen = torch.Generator(device=device).manual_seed(1234)  # the same held-out set every time
    total = 0.0
    for _ in range(eval_batches):
        x, y = get_batch(gen)
        total += F.cross_entropy(model(x), y).item()
    model.train()
    return total / eval_batches


val_losses = []  # one entry per evaluation
n_evals = steps // eval_every
weight_sum, n_summed = None, 0  # the running sum of the last `average_last` checkpoints
train_gen = torch.Generator(device=device).manual_seed(0)
for step in range(1, steps + 1):
    x, y = get_batch(train_gen)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % eval_every == 0:
        val_losses.append(evaluate())
        if step // eval_every > n_evals - average_last:
            with torch.no_grad():
                if weight_sum is None:
                    weight_sum = {k: v.clone() for k, v in model.state_dict().items()}
                else:
                    for k, v in model.state_dict().items():
                        weight_sum[k].add_(v)
            n_summed += 1
        mem = torch.cuda.memory_allocated() / 2**20
        print(f"step {step:3d}  train loss {loss.item():.4f}  val loss {val_losses[-1]:.4f}  allocated {mem:.0f} MiB")

# Load the average of the last checkpoints and see whether it beats each of them.
model.load_state_dict({k: v / n_summed for k, v in weight_sum.items()})
print(f"best single checkpoint: val loss {min(val_losses[-average_last:]):.4f}")
print(f"average of the last {n_summed}: val loss {evaluate():.4f}")
