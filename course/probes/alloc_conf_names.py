"""Which environment variable the allocator reads: ``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``, or both.

Each run sets the variables itself, before torch is imported, and tells by the
segment of a new tensor (the snapshot's ``is_expandable``) whether
``expandable_segments:True`` took effect:

- ``cuda_name``: only ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``;
- ``new_name``: only ``PYTORCH_ALLOC_CONF=expandable_segments:True``;
- ``both``: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False`` and
  ``PYTORCH_ALLOC_CONF=expandable_segments:True``: which one wins.

Run by ``oomlab dev facts`` in a fresh process per variant; prints one JSON object.
"""

import json
import os

# No PYTORCH_CUDA_ALLOC_CONF from `oomlab dev facts`: each variant sets its own variables (below).
ALLOC_CONF = {"cuda_name": "", "new_name": "", "both": ""}

SETTINGS = {
    "cuda_name": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "new_name": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    "both": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
}


def main() -> None:
    variant = os.environ["OOMLAB_PROBE_VARIANT"]
    os.environ.update(SETTINGS[variant])
    import torch

    t = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")
    ptr = t.data_ptr()
    segment = next(s for s in torch.cuda.memory._snapshot()["segments"] if s["address"] <= ptr < s["address"] + s["total_size"])
    is_expandable = bool(segment.get("is_expandable", False))
    facts = {"set": SETTINGS[variant], "expandable": is_expandable}
    if variant == "both":
        facts["winner"] = "PYTORCH_ALLOC_CONF" if is_expandable else "PYTORCH_CUDA_ALLOC_CONF"
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
