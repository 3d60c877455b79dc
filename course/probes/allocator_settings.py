"""What ``torch.cuda.memory._set_allocator_settings(s)`` changes at run time, started with expandable segments on.

Each call of it parses ``s`` afresh; this probe checks which earlier settings survive
a call whose ``s`` does not name them, by what the allocator then does:

- ``max_split_size``: a block of at least that size counts in ``oversize_allocations``;
- ``roundup_power2_divisions``: the allocated size of a 5 MiB + 1 byte request
  (6 MiB with ``:4``, 5 MiB + 512 bytes without);
- ``expandable_segments``: whether a new tensor's segment is expandable (the snapshot's ``is_expandable``).

It also records whether ``max_split_size_mb:20`` is accepted (older releases require more than 20).

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import json
import warnings

import torch

# PYTORCH_CUDA_ALLOC_CONF for this probe: the run starts with expandable segments on.
ALLOC_CONF = "expandable_segments:True"

MIB = 1 << 20
ODD = 5 * MIB + 1  # rounded to 6 MiB by roundup_power2_divisions:4, to 5 MiB + 512 bytes without


def set_settings(s: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in newer releases, in favour of torch._C._accelerator_setAllocatorSettings
        torch.cuda.memory._set_allocator_settings(s)


def stat(key: str) -> int:
    return torch.cuda.memory_stats().get(key, 0)


def expandable(t: torch.Tensor) -> bool | None:
    ptr = t.data_ptr()
    for seg in torch.cuda.memory._snapshot()["segments"]:
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return bool(seg.get("is_expandable", False))
    return None


def probe(kept: list) -> dict:
    """A 40 MiB tensor and a 5 MiB + 1 byte one: is max_split_size in force, the rounding, the segment kind."""
    oversize = stat("oversize_allocations.current")
    big = torch.empty(40 * MIB, dtype=torch.uint8, device="cuda")
    before = stat("allocated_bytes.all.current")
    odd = torch.empty(ODD, dtype=torch.uint8, device="cuda")
    allocated = stat("allocated_bytes.all.current") - before
    kept += [big, odd]
    return {
        "max_split_size_in_force": stat("oversize_allocations.current") > oversize,
        "odd_request_allocated_bytes": allocated,
        "new_tensor_expandable": expandable(big),
    }


def main() -> None:
    torch.cuda.init()
    kept: list = []
    facts = {"odd_request_bytes": ODD, "big_request_bytes": 40 * MIB, "at_start": probe(kept)}

    try:
        set_settings("max_split_size_mb:20")
        facts["max_split_20_accepted"], split_mb = True, 20
    except Exception as err:  # older releases: "max_split_size_mb too small, must be > 20"
        facts["max_split_20_accepted"], split_mb = False, 32
        facts["max_split_20_error"] = str(err).splitlines()[0][:200]
        set_settings(f"max_split_size_mb:{split_mb}")
    facts["max_split_mb_set"] = split_mb
    facts["after_max_split"] = probe(kept)

    set_settings("roundup_power2_divisions:4")
    facts["after_roundup"] = probe(kept)

    set_settings("garbage_collection_threshold:0.5")
    facts["after_gc_threshold"] = probe(kept)

    set_settings("expandable_segments:False")
    facts["after_expandable_off"] = probe(kept)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
