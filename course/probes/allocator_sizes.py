"""How the caching allocator sizes blocks and segments: the figures of the allocator page's first section.

Each case starts from an empty cache (every tensor freed, ``empty_cache()``), makes
requests of an exact number of bytes (uint8 tensors) and reads the allocator's
counters: what the last request counts as allocated and requested, which pool it came
from, and how much the allocator reserved from the driver for it.

Run by ``oomlab dev facts`` in a fresh process per variant; prints one JSON object.
"""

import json

import torch

# PYTORCH_CUDA_ALLOC_CONF for each run of this probe: the defaults, and roundup_power2_divisions:4.
ALLOC_CONF = {"defaults": "", "roundup4": "roundup_power2_divisions:4"}

MIB = 1 << 20


def counters() -> dict:
    s = torch.cuda.memory_stats()
    return {
        "allocated": s.get("allocated_bytes.all.current", 0),
        "requested": s.get("requested_bytes.all.current"),
        "reserved": s.get("reserved_bytes.all.current", 0),
        "small_pool": s.get("allocated_bytes.small_pool.current", 0),
        "non_releasable": s.get("inactive_split_bytes.all.current", 0),
    }


def case(*sizes: int) -> dict:
    """From an empty cache, request each size in turn (freeing all but the last); the last request's figures."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = counters()
    assert start["reserved"] == 0, f"the cache is not empty: {start}"
    *earlier, last = sizes
    for size in earlier:
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        del t
    before = counters()
    t = torch.empty(last, dtype=torch.uint8, device="cuda")
    after = counters()
    result = {
        "request_bytes": last,
        "freed_first_bytes": earlier[-1] if earlier else None,
        "allocated_bytes": after["allocated"] - before["allocated"],
        "requested_bytes": None if after["requested"] is None else after["requested"] - before["requested"],
        "new_reserved_bytes": after["reserved"] - before["reserved"],
        "reserved_bytes": after["reserved"],
        "non_releasable_bytes": after["non_releasable"],
        "small_pool": after["small_pool"] > before["small_pool"],
    }
    del t
    return result


def main() -> None:
    torch.cuda.init()
    facts = {
        # a 1-byte request: rounded to 512 bytes, served from a new 2 MiB small-pool segment
        "one_byte": case(1),
        # 1200 bytes: 512-byte rounding (roundup_power2_divisions:4 only rounds sizes above 2048 bytes)
        "bytes_1200": case(1200),
        # exactly 1 MiB still comes from the small pool; one byte more goes to the large pool
        "one_mib": case(MIB),
        "one_mib_plus_one": case(MIB + 1),
        # under 10 MiB: a 20 MiB segment; 10 MiB and more: a segment of its own, rounded up to 2 MiB
        "nine_mib": case(9 * MIB),
        "ten_mib": case(10 * MIB),
        "eleven_mib_plus_one": case(11 * MIB + 1),
        # 5 MiB and 1 byte: 512-byte rounding by default, the next quarter of [4, 8) MiB with roundup_power2_divisions:4
        "five_mib_plus_one": case(5 * MIB + 1),
        # a free 30 MiB block serving a 29 MiB request (remainder 1 MiB: not split) and a 20 MiB request (split)
        "reuse_29_of_30": case(30 * MIB, 29 * MIB),
        "reuse_20_of_30": case(30 * MIB, 20 * MIB),
    }
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
