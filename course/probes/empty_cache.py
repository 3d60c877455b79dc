"""What ``torch.cuda.empty_cache()`` releases: the allocator page's section on it.

1. Free a 30 MiB tensor, allocate 20 MiB (it takes the start of the freed block), call
   ``empty_cache()``: what stays reserved and what is non-releasable, with the default
   settings and with expandable segments (which release the fully free pages of a
   segment that a live block still uses).
2. Free a 256 MiB tensor and call ``empty_cache()``: how much more memory the driver then
   reports free (``torch.cuda.mem_get_info``), that is, memory any ``cudaMalloc`` can now
   get: another process's, or one in this process that does not go through PyTorch's allocator.

Run by ``oomlab dev facts`` in a fresh process per variant; prints one JSON object.
"""

import json

import torch

# PYTORCH_CUDA_ALLOC_CONF for each run of this probe.
ALLOC_CONF = {"defaults": "", "expandable": "expandable_segments:True"}

MIB = 1 << 20


def stat(key: str) -> int:
    return torch.cuda.memory_stats().get(key, 0)


def main() -> None:
    torch.cuda.init()
    a = torch.empty(30 * MIB, dtype=torch.uint8, device="cuda")
    reserved_for_30 = stat("reserved_bytes.all.current")
    del a
    b = torch.empty(20 * MIB, dtype=torch.uint8, device="cuda")
    before = {k: stat(f"{k}.all.current") for k in ("reserved_bytes", "allocated_bytes", "inactive_split_bytes")}
    torch.cuda.empty_cache()
    after = {k: stat(f"{k}.all.current") for k in ("reserved_bytes", "allocated_bytes", "inactive_split_bytes")}
    del b
    torch.cuda.empty_cache()

    big = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    del big
    torch.cuda.synchronize()
    cached = stat("reserved_bytes.all.current")
    free_before, _ = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()

    print(
        json.dumps(
            {
                "first_tensor_bytes": 30 * MIB,
                "second_tensor_bytes": 20 * MIB,
                "reserved_for_first_bytes": reserved_for_30,
                "reserved_before_bytes": before["reserved_bytes"],
                "reserved_after_bytes": after["reserved_bytes"],
                "released_bytes": before["reserved_bytes"] - after["reserved_bytes"],
                "allocated_bytes": after["allocated_bytes"],
                "non_releasable_before_bytes": before["inactive_split_bytes"],
                "non_releasable_after_bytes": after["inactive_split_bytes"],
                "cached_tensor_bytes": 256 * MIB,
                "cached_reserved_bytes": cached,
                "driver_free_gain_bytes": free_after - free_before,
            }
        )
    )


if __name__ == "__main__":
    main()
