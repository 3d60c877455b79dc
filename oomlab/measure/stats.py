"""The allocator statistics the course reads, by the names ``torch.cuda.memory_stats()`` gives them.

``memory_stats()`` returns a flat dict (``"allocated_bytes.all.peak"``); the
C binding ``torch._C._cuda_memoryStats`` returns the same figures nested. The
grader, the tools and the production monitor all read them through here.
Standard library only: the measuring child imports it.
"""

from __future__ import annotations

__all__ = ["ALLOCATOR_VARIABLES", "ALLOC_CONF_VARS", "FIGURES", "flatten", "read_figures"]

# Where the allocator reads its settings at CUDA start, the first that is set winning.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

# Every variable that changes what the caching allocator does or what the driver counts for the process:
# a measured run gets none of them from the caller's environment, only the exercise's own setting
# (a whitelist: oomlab.measure.harness.child_env). Each is read once, when CUDA or the allocator starts,
# and the measuring child starts both before the script's first line.
ALLOCATOR_VARIABLES = (
    *ALLOC_CONF_VARS,
    "PYTORCH_HIP_ALLOC_CONF",  # the same settings under ROCm's name, read by ROCm builds
    "PYTORCH_NO_CUDA_MEMORY_CACHING",  # every free straight back to the driver: reserved would read near zero
    "PYTORCH_NO_HIP_MEMORY_CACHING",
    "CUBLAS_WORKSPACE_CONFIG",  # cuBLAS workspace sizes, allocated inside reserved
    "CUBLASLT_WORKSPACE_SIZE",
    "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
    "CUDA_MODULE_LOADING",  # EAGER loads every kernel at start: a context of gigabytes outside the allocator
)

# Our name -> memory_stats() key. "Non-releasable" memory is inactive_split_bytes: free bytes
# inside segments that a live block keeps from being released (memory_summary's row of that name).
FIGURES = {
    "peak_allocated": "allocated_bytes.all.peak",
    "peak_reserved": "reserved_bytes.all.peak",
    "peak_requested": "requested_bytes.all.peak",
    "inactive_split_peak": "inactive_split_bytes.all.peak",
    "inactive_split_final": "inactive_split_bytes.all.current",
    "allocated_final": "allocated_bytes.all.current",
    "reserved_final": "reserved_bytes.all.current",
    "retries": "num_alloc_retries",
    "ooms": "num_ooms",
    "segments_peak": "segment.all.peak",
}


def flatten(nested: dict, prefix: str = "") -> dict:
    """``{"allocated_bytes": {"all": {"peak": n}}}`` -> ``{"allocated_bytes.all.peak": n}``, as memory_stats() does."""
    flat = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_figures(stats: dict) -> dict:
    """:data:`FIGURES` out of memory_stats() (flat or nested), 0 for a figure this torch does not report."""
    flat = flatten(stats)
    return {name: int(flat.get(key, 0)) for name, key in FIGURES.items()}
