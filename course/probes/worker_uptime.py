"""A long-lived inference worker watched by ``oomlab.production``: its allocator metrics over the requests it serves.

The worker answers requests of random length (seeded, the same in every run): each request
of L rows goes through a two-layer MLP without autograd, and its reply (L x 1024 floats,
1 to 32 MiB) is kept in a response cache of the last CACHE replies, the oldest evicted.
What stays allocated is bounded (the cache); what the allocator reserves need not be.
The process is capped at CAP (``set_per_process_memory_fraction``).

Every SCRAPE_EVERY requests the worker reads its own metrics as Prometheus would scrape
them (an :class:`oomlab.production.AllocatorMonitor` on a registry of its own) and asks
:class:`oomlab.production.RestartPolicy` whether to recycle it (``min_uptime_s=0``: the
probe has no warm-up to wait for). It stops at an OOM, which it records, or after REQUESTS.

Run by ``oomlab dev facts`` in a fresh process per variant; prints one JSON object.
"""

import json
import random
import time

import torch
import torch.nn.functional as F
from prometheus_client import CollectorRegistry

from oomlab.production import AllocatorMonitor, RestartPolicy

# PYTORCH_CUDA_ALLOC_CONF for each run of this probe.
ALLOC_CONF = {"defaults": "", "expandable": "expandable_segments:True"}

MIB = 1 << 20
CAP, REQUESTS, CACHE, SCRAPE_EVERY = 1536 * MIB, 3000, 48, 25
D_MODEL, D_HIDDEN, MIN_ROWS, MAX_ROWS = 1024, 4096, 256, 8192
METRICS = ("reserved_bytes", "allocated_bytes", "non_releasable_bytes", "fragmentation_ratio", "alloc_retries_total")


def main(cap: int = CAP, requests: int = REQUESTS) -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    registry = CollectorRegistry()
    AllocatorMonitor(device=0, registry=registry)
    policy = RestartPolicy(min_uptime_s=0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(D_MODEL, D_HIDDEN, device="cuda", generator=gen) / D_MODEL**0.5
    w2 = torch.randn(D_HIDDEN, D_MODEL, device="cuda", generator=gen) / D_HIDDEN**0.5
    lengths = random.Random(0)
    cache: dict[int, torch.Tensor] = {}
    samples, first_restart, oom_at, started = [], None, None, time.monotonic()

    def scrape(request: int) -> None:
        nonlocal first_restart
        sample = {"request": request}
        for name in METRICS:
            sample[name] = registry.get_sample_value(f"torch_cuda_allocator_{name}", {"device": "0"})
        decision = policy.decide(torch.cuda.memory_stats(0), uptime_s=time.monotonic() - started)
        sample["restart_rule"] = decision.rule
        if decision.restart and first_restart is None:
            first_restart = {"request": request, "rule": decision.rule}
        samples.append(sample)

    with torch.no_grad():
        for request in range(1, requests + 1):
            try:
                x = torch.randn(lengths.randint(MIN_ROWS, MAX_ROWS), D_MODEL, device="cuda", generator=gen)
                cache[request] = F.gelu(x @ w1) @ w2
                del x
            except torch.cuda.OutOfMemoryError:
                oom_at = request
                scrape(request)
                break
            cache.pop(request - CACHE, None)
            if request % SCRAPE_EVERY == 0:
                scrape(request)
    print(
        json.dumps(
            {
                "cap_bytes": cap,
                "requests": requests,
                "cache_replies": CACHE,
                "scrape_every": SCRAPE_EVERY,
                "served": (oom_at - 1) if oom_at else requests,
                "oom_at_request": oom_at,
                "first_restart": first_restart,
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                "samples": samples,
            }
        )
    )


if __name__ == "__main__":
    main()
