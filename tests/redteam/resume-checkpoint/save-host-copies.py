"""Resume fine-tuning a classifier head from a checkpoint.

A classifier head is fine-tuned on a frozen encoder. The first job trains it for
a few steps and is preempted, after it saved a checkpoint: the model's weights,
the optimizer's state and the step. The resumed job builds the model and the
optimizer again, restores them from the checkpoint and trains on. The first job
fits the budget with room to spare; the resumed one, the same model on the same
batches, dies with CUDA out of memory before its first step. Make it resume
within the budget, with the same training: the same restored weights and
optimizer state, the same steps and batches.

HONEST FIX. The checkpoint is saved from host copies: the first job moves
the model's weights and the optimizer's tensors to the CPU as it writes them,
so torch.load, which restores each tensor to the device it was saved from,
puts the checkpoint in host memory without any map_location. load_state_dict
copies the weights into the fresh model's parameters and the optimizer moves
its state to its parameters' device, as in the reference fix: the same
restored values, steps and batches, and the GPU holds one copy of the model.
"""

import io

import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda"
d_in, d_model, n_layers, d_head, n_classes = 1024, 8192, 4, 1024, 10
batch_size, lr, steps_before, total_steps = 256, 3e-4, 10, 30

torch.manual_seed(0)
teacher = torch.randn(d_in, n_classes, device=device)  # labels come from a fixed random teacher


def get_batch(step):
    gen = torch.Generator(device=device).manual_seed(step)  # a step's batch depends on the step alone
    x = torch.randn(batch_size, d_in, device=device, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Linear(d_in, d_model), nn.GELU()]
        for _ in range(n_layers - 1):
            layers += [nn.Linear(d_model, d_model), nn.GELU()]
        self.encoder = nn.Sequential(*layers, nn.LayerNorm(d_model))
        self.head = nn.Sequential(nn.Linear(d_model, d_head), nn.GELU(), nn.Linear(d_head, n_classes))

    def forward(self, x):
        return self.head(self.encoder(x))


def build_model():
    torch.manual_seed(0)  # stands in for pretrained encoder weights: every job builds the same ones
    model = Classifier().to(device)
    model.encoder.requires_grad_(False)  # frozen: only the head is fine-tuned
    return model


def train(model, optimizer, steps):
    for step in steps:
        x, y = get_batch(step)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")


def first_job():
    """The job that was preempted; the checkpoint it saved is all that is left of it."""
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    n_trained = sum(p.numel() for p in model.head.parameters())
    print(f"{n_params / 1e6:.1f}M parameters ({n_params * 4 / 2**20:.0f} MiB fp32), {n_trained / 1e6:.1f}M of them trained")
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=lr)
    train(model, optimizer, range(1, steps_before + 1))
    checkpoint = io.BytesIO()  # stands in for a file on disk: this script writes no files

    # Saved from host copies: torch.load puts each tensor back on the device it was saved from.
    def on_host(tree):
        if isinstance(tree, dict):
            return {k: on_host(v) for k, v in tree.items()}
        return tree.cpu() if isinstance(tree, torch.Tensor) else tree

    torch.save(
        {"model": on_host(model.state_dict()), "optimizer": on_host(optimizer.state_dict()), "step": steps_before}, checkpoint
    )
    checkpoint.seek(0)
    return checkpoint


checkpoint_file = first_job()

# The resumed job: the same model and optimizer, built again and restored from the checkpoint.
model = build_model()
optimizer = torch.optim.AdamW(model.head.parameters(), lr=lr)
ckpt = torch.load(checkpoint_file, weights_only=True)
model.load_state_dict(ckpt["model"])
optimizer.load_state_dict(ckpt["optimizer"])
start = ckpt["step"] + 1
print(f"resumed at step {start}")
train(model, optimizer, range(start, total_steps + 1))
