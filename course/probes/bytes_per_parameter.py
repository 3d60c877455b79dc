"""What a parameter costs at rest, by precision policy and optimizer, and what that rule says about big models.

A stack of square ``nn.Linear`` layers (no other state) trains two steps under each
policy, and the caching allocator is read between steps: the bytes the weights, their
gradients and the optimizer's state hold for every parameter, with the gradients kept
after the step (``zero_grad(set_to_none=False)``, or no ``zero_grad`` before the next
forward) and without them (``set_to_none=True``, the default since torch 2.0).

Policies:

- ``fp32_adamw``, ``fp32_sgd_momentum``, ``fp32_sgd``: fp32 weights, one optimizer each;
- ``fp32_adafactor``: ``torch.optim.Adafactor`` as torch ships it (torch 2.5 and newer;
  ``null`` on older torch): its second moment factored into a row and a column vector;
- ``autocast_bf16_adamw``: fp32 weights under ``torch.autocast(dtype=torch.bfloat16)``;
  the bf16 copies autocast makes live only inside the forward;
- ``bf16_masters_adamw``: bf16 weights and gradients, fp32 master copies that AdamW steps
  and copies back (the masters' own gradients dropped after each step);
- ``bf16_adamw``: bf16 weights, gradients and AdamW state, no fp32 copy at all.

``scaled``: the measured rule multiplied out for a 7-billion and a 70-billion parameter
model (weights, gradients and optimizer state only: no activations, no workspaces), beside
the card the sizing question names and this GPU's own total memory.

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import gc
import json

import torch
import torch.nn as nn

# PYTORCH_CUDA_ALLOC_CONF for this probe: the defaults.
ALLOC_CONF = ""

LAYERS, WIDTH, BATCH = 8, 2048, 64
SEVEN_B, SEVENTY_B = 7 * 10**9, 70 * 10**9
CARD_BYTES = 80 * 10**9  # the 80 GB card of the question ("does a 7B model train on one 80 GB GPU?")


def settle() -> int:
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def warm_up() -> None:
    """Make the libraries' workspaces (cuBLAS's, one per stream and thread) before anything is counted."""
    layer = nn.Linear(WIDTH, WIDTH, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer(torch.randn(BATCH, WIDTH, device="cuda")).float().sum().backward()
    layer.to(torch.bfloat16)(torch.randn(BATCH, WIDTH, device="cuda", dtype=torch.bfloat16)).float().sum().backward()
    del layer


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-4)


def sgd_momentum(params):
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9)


def sgd(params):
    return torch.optim.SGD(params, lr=1e-3)


def adafactor(params):
    return torch.optim.Adafactor(params, lr=1e-3)


# Each policy: the dtype of the model's weights, and the optimizer.
POLICIES = {
    "fp32_adamw": (torch.float32, adamw),
    "fp32_sgd_momentum": (torch.float32, sgd_momentum),
    "fp32_sgd": (torch.float32, sgd),
    "fp32_adafactor": (torch.float32, adafactor),
    "autocast_bf16_adamw": (torch.float32, adamw),
    "bf16_masters_adamw": (torch.bfloat16, adamw),
    "bf16_adamw": (torch.bfloat16, adamw),
}


def train_step(name: str, model, x, optimizer, masters) -> None:
    """One step of the policy: forward, backward, the optimizer, and the copy back from the masters where there are any."""
    if name.startswith("autocast"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
    else:
        loss = model(x).float().square().mean()
    loss.backward()
    if masters is None:
        optimizer.step()
        return
    params = list(model.parameters())
    for master, p in zip(masters, params, strict=True):
        master.grad = p.grad.float()
    optimizer.step()
    for master, p in zip(masters, params, strict=True):
        p.data.copy_(master)
        master.grad = None


def policy(name: str, base: int) -> dict:
    """Two steps of one policy; the bytes per parameter without and with the gradients kept."""
    weights_dtype, make_optimizer = POLICIES[name]
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))).to("cuda", weights_dtype)
    n = sum(p.numel() for p in model.parameters())
    weights = settle() - base
    masters = [p.detach().float() for p in model.parameters()] if name == "bf16_masters_adamw" else None
    optimizer = make_optimizer(masters or list(model.parameters()))
    x = torch.randn(BATCH, WIDTH, device="cuda", dtype=weights_dtype)
    batch = x.untyped_storage().nbytes()
    train_step(name, model, x, optimizer, masters)
    # The model's gradients, not the optimizer's: with masters, the optimizer steps the fp32 copies, whose gradients
    # the step already dropped, and the bf16 gradients backward made would stay.
    model.zero_grad(set_to_none=True)
    without = settle() - base - batch
    train_step(name, model, x, optimizer, masters)  # the gradients of this step stay
    kept = settle() - base - batch
    del model, masters, optimizer, x
    settle()
    return {
        "parameters": n,
        "weights_per_parameter": weights / n,
        "gradients_per_parameter": (kept - without) / n,
        "optimizer_and_masters_per_parameter": (without - weights) / n,
        "without_gradients_per_parameter": without / n,
        "with_gradients_per_parameter": kept / n,
    }


def main() -> None:
    warm_up()
    base = settle()
    shipped = hasattr(torch.optim, "Adafactor")  # torch 2.5 and newer
    policies = {name: policy(name, base) if shipped or name != "fp32_adafactor" else None for name in POLICIES}

    def scaled(params: int) -> dict:
        return {
            f"{name}_bytes": round(params * policies[name]["with_gradients_per_parameter"])
            for name in ("fp32_adamw", "bf16_masters_adamw", "bf16_adamw")
        }

    print(
        json.dumps(
            {
                "layers": LAYERS,
                "width": WIDTH,
                "policies": policies,
                "scaled": {
                    "seven_b_parameters": SEVEN_B,
                    "seventy_b_parameters": SEVENTY_B,
                    "card_bytes": CARD_BYTES,
                    "this_gpu_bytes": torch.cuda.get_device_properties(0).total_memory,
                    "seven_b": scaled(SEVEN_B),
                    "seventy_b": scaled(SEVENTY_B),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
