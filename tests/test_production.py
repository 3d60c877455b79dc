"""The production helpers on CPU: metrics from a fake memory_stats() dict, the restart rules, retry rates."""

from __future__ import annotations

import urllib.request

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from oomlab import production  # noqa: E402
from oomlab.errors import OomLabError  # noqa: E402
from oomlab.production import AllocatorMonitor, Decision, RestartPolicy, RetryRate  # noqa: E402
from oomlab.units import GIB, MIB  # noqa: E402


def fake_stats(**changes) -> dict:
    """A flat memory_stats() dict of a worker: 6 GiB reserved, 4 GiB allocated, 512 MiB stranded."""
    stats = {
        "reserved_bytes.all.current": 6 * GIB,
        "allocated_bytes.all.current": 4 * GIB,
        "inactive_split_bytes.all.current": 512 * MIB,
        "reserved_bytes.all.peak": 7 * GIB,
        "allocated_bytes.all.peak": 5 * GIB,
        "inactive_split_bytes.all.peak": 900 * MIB,
        "num_alloc_retries": 3,
        "num_ooms": 0,
        "segment.all.current": 12,  # present in real stats, not exported
    }
    stats.update(changes)
    return stats


def scrape(registry) -> dict:
    """``{sample name: (value, metric type, labels)}`` from the registry's text exposition."""
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = (sample.value, family.type, sample.labels)
    return out


def test_collector_exports_every_figure_with_its_type_and_device():
    registry = CollectorRegistry()
    AllocatorMonitor(device=1, registry=registry, stats=fake_stats)
    samples = scrape(registry)
    p = "torch_cuda_allocator"
    expected = {
        f"{p}_reserved_bytes": (6 * GIB, "gauge"),
        f"{p}_allocated_bytes": (4 * GIB, "gauge"),
        f"{p}_non_releasable_bytes": (512 * MIB, "gauge"),
        f"{p}_peak_reserved_bytes": (7 * GIB, "gauge"),
        f"{p}_peak_allocated_bytes": (5 * GIB, "gauge"),
        f"{p}_peak_non_releasable_bytes": (900 * MIB, "gauge"),
        f"{p}_alloc_retries_total": (3, "counter"),
        f"{p}_ooms_total": (0, "counter"),
        f"{p}_up": (1, "gauge"),
    }
    for name, (value, kind) in expected.items():
        assert name in samples, name
        assert samples[name][:2] == (value, kind), name
        assert samples[name][2] == {"device": "1"}
    ratio, kind, _ = samples[f"{p}_fragmentation_ratio"]
    assert kind == "gauge" and ratio == pytest.approx(1 - 4 / 6)
    assert not any("segment" in name for name in samples)


def test_values_are_read_at_scrape_time_and_the_prefix_is_used():
    current = {"value": fake_stats()}
    registry = CollectorRegistry()
    AllocatorMonitor(registry=registry, prefix="worker_gpu", stats=lambda: current["value"])
    assert scrape(registry)["worker_gpu_allocated_bytes"][0] == 4 * GIB
    current["value"] = fake_stats(**{"allocated_bytes.all.current": GIB, "num_ooms": 2})
    samples = scrape(registry)
    assert samples["worker_gpu_allocated_bytes"][0] == GIB
    assert samples["worker_gpu_ooms_total"][0] == 2
    assert samples["worker_gpu_fragmentation_ratio"][0] == pytest.approx(1 - 1 / 6)


def test_a_failed_read_reports_down_instead_of_breaking_the_scrape():
    def broken():
        raise RuntimeError("driver gone")

    registry = CollectorRegistry()
    AllocatorMonitor(registry=registry, stats=broken)
    samples = scrape(registry)
    assert samples == {"torch_cuda_allocator_up": (0, "gauge", {"device": "0"})}


def test_registering_twice_is_refused_as_a_duplicate():
    registry = CollectorRegistry()
    monitor = AllocatorMonitor(registry=registry, stats=fake_stats)
    with pytest.raises(ValueError, match="Duplicated"):
        AllocatorMonitor(registry=registry, stats=fake_stats)
    monitor.unregister()
    AllocatorMonitor(registry=registry, stats=fake_stats)


def test_fragmentation_ratio():
    assert production.fragmentation(fake_stats()) == pytest.approx(1 / 3)
    assert production.fragmentation({}) == 0.0
    assert production.fragmentation(fake_stats(**{"reserved_bytes.all.current": 0, "allocated_bytes.all.current": 0})) == 0.0
    full = fake_stats(**{"allocated_bytes.all.current": 6 * GIB})
    assert production.fragmentation(full) == 0.0


def test_without_cuda_and_without_stats_construction_refuses(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(OomLabError, match="no CUDA device"):
        AllocatorMonitor(registry=CollectorRegistry())


@pytest.mark.gpu
def test_on_the_gpu_the_default_reader_sees_a_live_tensor():
    torch = pytest.importorskip("torch")
    registry = CollectorRegistry()
    AllocatorMonitor(device=torch.cuda.current_device(), registry=registry)
    block = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    samples = scrape(registry)
    assert samples["torch_cuda_allocator_up"][0] == 1
    assert samples["torch_cuda_allocator_allocated_bytes"][0] >= 64 * MIB
    assert samples["torch_cuda_allocator_reserved_bytes"][0] >= samples["torch_cuda_allocator_allocated_bytes"][0]
    assert 0.0 <= samples["torch_cuda_allocator_fragmentation_ratio"][0] < 1.0
    del block


# A worker that strands memory and then runs out of it, under a 1 GiB cap, serving its metrics.
_WORKER = """
import json, sys, urllib.request
import torch
from prometheus_client import CollectorRegistry
from oomlab.production import AllocatorMonitor, RestartPolicy, serve

torch.cuda.set_per_process_memory_fraction(2**30 / torch.cuda.get_device_properties(0).total_memory)
registry = CollectorRegistry()
AllocatorMonitor(registry=registry)
server = serve(0, registry=registry)  # port 0: the OS picks a free one
port = server[0].server_port
# Each 20 MiB tensor is carved from the cached 32 MiB segment of a freed temporary,
# and pins it: the 12 MiB left over is free but cannot be returned.
kept = []
for _ in range(24):
    temporary = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    del temporary
    kept.append(torch.empty(20 << 20, dtype=torch.uint8, device="cuda"))
try:
    torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError:
    pass
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
stats = torch.cuda.memory_stats()
decision = RestartPolicy(min_uptime_s=0).decide(stats, uptime_s=60)
print(json.dumps({"text": text, "stats": stats, "restart": decision.restart, "rule": decision.rule}))
"""


@pytest.mark.gpu
def test_on_the_gpu_a_fragmented_worker_that_ran_out_is_scraped_with_its_real_figures(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "worker.py"
    script.write_text(_WORKER, encoding="utf-8")
    root = Path(production.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    stats = report["stats"]
    samples = {}
    for family in text_string_to_metric_families(report["text"]):
        for sample in family.samples:
            samples[sample.name] = sample.value
    # Nothing was allocated or freed between the scrape and the memory_stats() call.
    assert samples["torch_cuda_allocator_up"] == 1
    assert samples["torch_cuda_allocator_allocated_bytes"] == stats["allocated_bytes.all.current"] == 24 * 20 * MIB
    assert samples["torch_cuda_allocator_reserved_bytes"] == stats["reserved_bytes.all.current"]
    assert samples["torch_cuda_allocator_non_releasable_bytes"] == stats["inactive_split_bytes.all.current"] >= 24 * 12 * MIB
    assert samples["torch_cuda_allocator_ooms_total"] == stats["num_ooms"] == 1
    assert samples["torch_cuda_allocator_alloc_retries_total"] == stats["num_alloc_retries"] >= 1
    assert samples["torch_cuda_allocator_fragmentation_ratio"] == pytest.approx(
        1 - stats["allocated_bytes.all.current"] / stats["reserved_bytes.all.current"]
    )
    assert report["restart"] and report["rule"] == "oom"


def test_serve_exposes_the_registry_over_http():
    registry = CollectorRegistry()
    AllocatorMonitor(registry=registry, stats=fake_stats)
    server, thread = production.serve(0, registry=registry)
    try:
        port = server.server_port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'torch_cuda_allocator_alloc_retries_total{device="0"} 3.0' in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# --------------------------------------------------------------------------- restart policy

HEALTHY = fake_stats(**{"reserved_bytes.all.current": 5 * GIB, "num_alloc_retries": 0})  # 20% unused


def test_healthy_worker_is_kept_with_its_figures():
    decision = RestartPolicy().decide(HEALTHY, uptime_s=7200)
    assert decision == Decision(False, decision.reason, "")
    assert decision.reason.startswith("healthy: ")
    assert "fragmentation 20%" in decision.reason and "512 MiB non-releasable" in decision.reason


def test_oom_fires():
    decision = RestartPolicy().decide(fake_stats(num_ooms=1), uptime_s=30)
    assert decision.restart and decision.rule == "oom" and "1 out-of-memory" in decision.reason


def test_frequent_retries_fire():
    policy = RestartPolicy(max_retries_per_hour=10)
    assert policy.decide(HEALTHY, uptime_s=7200, retries_in_last_hour=11).rule == "retries"
    assert not policy.decide(HEALTHY, uptime_s=7200, retries_in_last_hour=10).restart
    # Without a rate, the total is spread over the uptime: 30 retries in 2 h is 15 per hour.
    assert (
        policy.decide(fake_stats(**{"reserved_bytes.all.current": 5 * GIB, "num_alloc_retries": 30}), uptime_s=7200).rule
        == "retries"
    )
    # ... and a young worker's retries count in full, as if all in the last hour.
    assert (
        policy.decide(fake_stats(**{"reserved_bytes.all.current": 5 * GIB, "num_alloc_retries": 11}), uptime_s=60).rule
        == "retries"
    )


def test_non_releasable_cap_fires():
    policy = RestartPolicy(max_non_releasable_bytes=256 * MIB)
    decision = policy.decide(HEALTHY, uptime_s=7200)
    assert decision.restart and decision.rule == "non_releasable" and "512 MiB" in decision.reason
    assert not RestartPolicy(max_non_releasable_bytes=GIB).decide(HEALTHY, uptime_s=7200).restart


def test_fragmentation_fires():
    fragmented = fake_stats(**{"reserved_bytes.all.current": 10 * GIB, "num_alloc_retries": 0})  # 60% unused
    decision = RestartPolicy(max_fragmentation=0.5).decide(fragmented, uptime_s=7200)
    assert decision.restart and decision.rule == "fragmentation" and "60%" in decision.reason
    assert not RestartPolicy(max_fragmentation=0.7).decide(fragmented, uptime_s=7200).restart


def test_max_uptime_fires():
    assert RestartPolicy(max_uptime_s=86_400).decide(HEALTHY, uptime_s=90_000).rule == "max_uptime"
    assert not RestartPolicy(max_uptime_s=86_400).decide(HEALTHY, uptime_s=80_000).restart


def test_min_uptime_prevents_early_restarts():
    fragmented = fake_stats(**{"reserved_bytes.all.current": 10 * GIB, "num_alloc_retries": 0})
    policy = RestartPolicy(max_fragmentation=0.5, max_non_releasable_bytes=100 * MIB, min_uptime_s=600)
    early = policy.decide(fragmented, uptime_s=599)
    assert not early.restart and "warming up" in early.reason
    assert policy.decide(fragmented, uptime_s=600).restart
    # An OOM is not a warm-up effect: it fires at once.
    assert policy.decide(fake_stats(num_ooms=1), uptime_s=1).restart


def test_the_first_rule_that_fires_decides():
    everything = fake_stats(**{"reserved_bytes.all.current": 10 * GIB, "num_ooms": 1, "num_alloc_retries": 50})
    policy = RestartPolicy(max_non_releasable_bytes=MIB, max_uptime_s=1)
    assert policy.decide(everything, uptime_s=7200).rule == "oom"
    assert policy.decide({**everything, "num_ooms": 0}, uptime_s=7200).rule == "retries"
    assert policy.decide({**everything, "num_ooms": 0, "num_alloc_retries": 0}, uptime_s=7200).rule == "non_releasable"


# --------------------------------------------------------------------------- retry rate


def test_retry_rate_over_a_sliding_hour():
    rate = RetryRate(window_s=3600)
    assert rate.per_hour() == 0.0 and rate.count() == 0
    rate.add(100, at=0)  # the process had retried before we started watching: only growth counts
    assert rate.per_hour() == 0.0
    rate.add(103, at=1800)
    assert rate.count() == 3 and rate.per_hour() == pytest.approx(6.0)
    rate.add(105, at=3600)
    assert rate.count() == 5 and rate.per_hour() == pytest.approx(5.0)
    rate.add(111, at=5400)  # the baseline moves to the reading at 1800 s
    assert rate.count() == 8 and rate.per_hour() == pytest.approx(8.0)


def test_retry_rate_counts_a_counter_reset_from_zero():
    rate = RetryRate(window_s=3600)
    rate.add(10, at=0)
    rate.add(12, at=600)
    rate.add(1, at=1200)  # a new process: 1 retry since it started
    assert rate.count() == 3
    assert rate.per_hour() == pytest.approx(3 * 3600 / 1200)


def test_retry_rate_feeds_the_policy():
    rate = RetryRate()
    for minute, retries in enumerate([0, 4, 8, 12]):
        rate.add(retries, at=minute * 60)
    decision = RestartPolicy(max_retries_per_hour=10).decide(HEALTHY, uptime_s=7200, retries_in_last_hour=rate.count())
    assert decision.restart and decision.rule == "retries"
