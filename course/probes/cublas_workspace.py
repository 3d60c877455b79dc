"""The cuBLAS workspaces: memory that PyTorch's allocator hands to cuBLAS and that stays allocated.

PyTorch gives each cuBLAS handle, per thread and stream, a workspace that it allocates
through its caching allocator the first time that handle multiplies matrices, and keeps
(``aten/src/ATen/cuda/CublasHandlePool.cpp``). Backward runs on autograd's own thread
for the GPU, so a training step uses two. This probe measures what allocated memory
grows by, beyond the results, at the first matrix product on the main thread, then at
the first backward through one, and what ``torch._C._cuda_clearCublasWorkspaces()`` frees.

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import json

import torch

# PYTORCH_CUDA_ALLOC_CONF for this probe: the defaults.
ALLOC_CONF = ""

N = 256


def allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def block(t: torch.Tensor) -> int:
    """The allocator's block for a tensor this small: its bytes rounded up to 512."""
    return -(-t.untyped_storage().nbytes() // 512) * 512


def main() -> None:
    a = torch.randn(N, N, device="cuda")
    w = torch.randn(N, N, device="cuda", requires_grad=True)
    before = allocated()
    c = a @ a
    first_matmul = allocated() - before - block(c)

    loss = (a @ w).sum()
    before = allocated()
    loss.backward()
    first_backward = allocated() - before - block(w.grad)

    before = allocated()
    cleared = None
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
        cleared = before - allocated()
    print(
        json.dumps(
            {
                "first_matmul_bytes": first_matmul,
                "first_backward_bytes": first_backward,
                "both_bytes": first_matmul + first_backward,
                "cleared_bytes": cleared,
            }
        )
    )


if __name__ == "__main__":
    main()
