"""A training loop with a seeded leak, under the OOM hook: tests/test_oom_hook.py runs it on a GPU.

Each step trains an MLP, then "monitors" it on a fixed validation batch
without ``torch.no_grad()`` and keeps the result in ``monitored``: every kept
loss carries the autograd graph of a forward pass nobody runs backward on, and
so every activation it saved. Under a memory cap the loop runs out of memory
after a few dozen steps, and the hook's report should name ``monitored``.

Usage::

    python tests/oom_hook_example.py REPORTS [--how with|install] [--devices N] [--budget-mib MIB] [--no-history]

``--how with`` puts the loop in ``with oom_report(REPORTS)``; ``--how install``
calls ``install(REPORTS)`` at the top and runs the loop unindented. With
``--devices 2`` the same model trains on cuda:0 and cuda:1, each capped.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from oomlab.oom_hook import install, oom_report

parser = argparse.ArgumentParser()
parser.add_argument("reports")
parser.add_argument("--how", choices=("with", "install"), default="with")
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--budget-mib", type=int, default=1024)
parser.add_argument("--no-history", action="store_true")
args = parser.parse_args()

if args.how == "install":
    install(args.reports, record_history=not args.no_history)

devices = [torch.device("cuda", i) for i in range(args.devices)]
for device in devices:
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(args.budget_mib * 2**20 / total, device)

torch.manual_seed(0)
models = [nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(device) for device in devices]
optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-4) for model in models]
validation = [torch.randn(1024, 1024, device=device) for device in devices]
monitored = []  # the seeded leak: one validation loss per step per device, each with its whole graph


def train_step(model, optimizer, x_val):
    x = torch.randn(1024, 1024, device=x_val.device)
    loss = F.mse_loss(model(x), x)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    monitored.append(F.mse_loss(model(x_val), x_val))  # BUG: no torch.no_grad(), and the tensor is kept


def train(steps: int = 10_000):
    for step in range(steps):
        for model, optimizer, x_val in zip(models, optimizers, validation, strict=True):
            train_step(model, optimizer, x_val)
        if step % 10 == 0:
            print(f"step {step}: {len(monitored)} losses kept, {torch.cuda.memory_allocated() / 2**20:.0f} MiB allocated")


if args.how == "with":
    with oom_report(args.reports, record_history=not args.no_history):
        train()
else:
    train()
