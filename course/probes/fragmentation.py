"""A fragmenting allocation pattern under a cap, with the default settings and with each setting against it.

Every iteration allocates a 32 MiB temporary, frees it, then allocates a 20 MiB tensor
that is kept (the pattern of the ``feature-cache`` exercise): with the defaults, each kept
tensor lands, by best fit, in the block the temporary left, splits it, and pins its
segment, so every temporary needs a new segment. The cap is 400 MiB
(``set_per_process_memory_fraction``); the kept tensors need 320 MiB after 16 iterations.

Run by ``oomlab dev facts`` in a fresh process per variant (its allocator settings
below); prints one JSON object.
"""

import json

import torch

# PYTORCH_CUDA_ALLOC_CONF for each run of this probe.
ALLOC_CONF = {
    "defaults": "",
    "expandable": "expandable_segments:True",
    "max_split_32": "max_split_size_mb:32",
    "max_split_128": "max_split_size_mb:128",
}

MIB = 1 << 20
CAP, ITERATIONS, TEMPORARY, KEPT = 400 * MIB, 16, 32 * MIB, 20 * MIB


def main() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP / total, 0)
    kept, done, oom, free_at_oom = [], 0, False, None
    for _ in range(ITERATIONS):
        try:
            temporary = torch.empty(TEMPORARY, dtype=torch.uint8, device="cuda")
            del temporary
            kept.append(torch.empty(KEPT, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            oom = True
            free_at_oom = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
            break
        done += 1
    s = torch.cuda.memory_stats()
    print(
        json.dumps(
            {
                "cap_bytes": CAP,
                "iterations": ITERATIONS,
                "temporary_bytes": TEMPORARY,
                "kept_each_bytes": KEPT,
                "oom": oom,
                "iterations_done": done,
                "kept_bytes": sum(t.untyped_storage().nbytes() for t in kept),
                "reserved_but_free_at_oom_bytes": free_at_oom,
                "peak_allocated_bytes": s.get("allocated_bytes.all.peak", 0),
                "peak_reserved_bytes": s.get("reserved_bytes.all.peak", 0),
                "non_releasable_peak_bytes": s.get("inactive_split_bytes.all.peak", 0),
                "segments_peak": s.get("segment.all.peak", 0),
                "retries": s.get("num_alloc_retries", 0),
            }
        )
    )


if __name__ == "__main__":
    main()
