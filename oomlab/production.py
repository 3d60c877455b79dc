"""Watching the caching allocator of a long-lived worker, and deciding when to recycle it.

A training or inference worker that runs for days can die of memory it does
not use: blocks freed inside segments that one live block pins (fragmentation),
cache it cannot return, cache flushes that precede an OOM. This module exposes
the allocator's figures as Prometheus metrics, read at scrape time, and turns
them into a restart decision:

- :class:`AllocatorMonitor`  a ``prometheus_client`` collector over ``torch.cuda.memory_stats()``
- :func:`serve`               prometheus_client's HTTP server for a registry
- :class:`RestartPolicy`      recycle the worker, or not, and why
- :class:`RetryRate`          successive ``num_alloc_retries`` readings -> retries per hour

Everything but the default statistics reader works on plain dicts, so the
policy and the metrics can be tested without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from oomlab.errors import OomLabError
from oomlab.measure.stats import FIGURES
from oomlab.units import MIB

HOUR_S = 3600.0

# Keys of the flat dict that torch.cuda.memory_stats() returns.
RESERVED = FIGURES["reserved_final"]
ALLOCATED = FIGURES["allocated_final"]
NON_RELEASABLE = FIGURES["inactive_split_final"]
RESERVED_PEAK = FIGURES["peak_reserved"]
ALLOCATED_PEAK = FIGURES["peak_allocated"]
NON_RELEASABLE_PEAK = FIGURES["inactive_split_peak"]
RETRIES = FIGURES["retries"]
OOMS = FIGURES["ooms"]


def fragmentation(stats: dict) -> float:
    """``1 - allocated / reserved``: the share of the allocator's memory that no tensor uses.

    It counts cached free segments as well as free blocks stranded inside
    segments that live blocks pin; ``inactive_split_bytes`` is the stranded
    part alone. 0 when nothing is reserved.
    """
    reserved = stats.get(RESERVED, 0)
    if reserved <= 0:
        return 0.0
    return max(0.0, 1.0 - stats.get(ALLOCATED, 0) / reserved)


def cuda_memory_stats(device: int = 0) -> Callable[[], dict]:
    """A reader of ``torch.cuda.memory_stats(device)``; raises :class:`OomLabError` without CUDA.

    Without CUDA ``memory_stats()`` silently returns ``{}``, which would
    export zeros that look like a healthy, empty GPU: refuse instead.
    """
    try:
        import torch
    except ImportError as err:
        raise OomLabError(
            "PyTorch is not installed, so there is no allocator to monitor.", "Install torch with CUDA support."
        ) from err
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise OomLabError(
            f"torch {torch.__version__} ({build}) sees no CUDA device, so there are no allocator statistics to export.",
            "Run the worker on a GPU machine, or pass stats= a callable returning a memory_stats() dict.",
        )
    return lambda: torch.cuda.memory_stats(device)


class AllocatorMonitor:
    """Exports the CUDA caching allocator's statistics as Prometheus metrics, read at every scrape.

    Metrics (``prefix`` = ``torch_cuda_allocator``, each labelled ``device``):

    - ``<prefix>_reserved_bytes``, ``_allocated_bytes``, ``_non_releasable_bytes`` (gauges): now;
    - ``<prefix>_peak_reserved_bytes``, ``_peak_allocated_bytes``, ``_peak_non_releasable_bytes``
      (gauges): since the process started or the peaks were last reset;
    - ``<prefix>_alloc_retries_total`` (counter): times the allocator freed its whole cache
      and retried a request, each one step short of an OOM;
    - ``<prefix>_ooms_total`` (counter): out-of-memory errors raised;
    - ``<prefix>_fragmentation_ratio`` (gauge): ``1 - allocated / reserved``;
    - ``<prefix>_up`` (gauge): 1 when the statistics could be read at this scrape, else 0.

    Non-releasable bytes are ``inactive_split_bytes``: free memory inside
    segments that a live block keeps, which ``empty_cache()`` cannot return.
    With ``expandable_segments:True`` they read 0 by design.

    Args:
        device: the CUDA device index whose allocator is read.
        registry: where to register; ``prometheus_client.REGISTRY`` by default.
        prefix: the metric names' prefix.
        stats: a callable returning a flat ``torch.cuda.memory_stats()`` dict
            (tests, or another process's figures); by default the device's own.
    """

    def __init__(
        self, device: int = 0, registry=None, prefix: str = "torch_cuda_allocator", stats: Callable[[], dict] | None = None
    ):
        self.device = int(device)
        self.prefix = prefix
        self.read = stats if stats is not None else cuda_memory_stats(self.device)
        if registry is None:
            from prometheus_client import REGISTRY as registry
        self.registry = registry
        registry.register(self)

    def _families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p, labels = self.prefix, ["device"]

        def gauge(name, doc):
            return GaugeMetricFamily(f"{p}_{name}", doc, labels=labels)

        return {
            "up": gauge("up", "1 when the allocator statistics could be read at this scrape, else 0."),
            RESERVED: gauge("reserved_bytes", "Bytes the caching allocator holds from the GPU, cache included."),
            ALLOCATED: gauge("allocated_bytes", "Bytes in blocks that live tensors use."),
            NON_RELEASABLE: gauge(
                "non_releasable_bytes",
                "Free bytes inside segments pinned by a live block (inactive_split_bytes): empty_cache() cannot return them.",
            ),
            RESERVED_PEAK: gauge(
                "peak_reserved_bytes", "Highest reserved bytes since the process started or the peaks were reset."
            ),
            ALLOCATED_PEAK: gauge(
                "peak_allocated_bytes", "Highest allocated bytes since the process started or the peaks were reset."
            ),
            NON_RELEASABLE_PEAK: gauge(
                "peak_non_releasable_bytes", "Highest non-releasable bytes since the process started or the peaks were reset."
            ),
            RETRIES: CounterMetricFamily(
                f"{p}_alloc_retries",
                "Times the allocator freed all cached segments and retried a request: each one step short of an OOM.",
                labels=labels,
            ),
            OOMS: CounterMetricFamily(f"{p}_ooms", "Out-of-memory errors the allocator raised.", labels=labels),
            "fragmentation": gauge(
                "fragmentation_ratio", "1 - allocated/reserved: the share of reserved memory that no tensor uses."
            ),
        }

    def describe(self):
        """The metric names, without reading the GPU: lets the registry catch duplicates at registration."""
        return list(self._families().values())

    def collect(self):
        families = self._families()
        label = [str(self.device)]
        try:
            stats = dict(self.read())
        except Exception:  # a failed read must not break the scrape of every other metric
            families["up"].add_metric(label, 0)
            return [families["up"]]
        families["up"].add_metric(label, 1)
        for key, family in families.items():
            if key in stats:
                family.add_metric(label, float(stats[key]))
        families["fragmentation"].add_metric(label, fragmentation(stats))
        return [family for family in families.values() if family.samples]

    def unregister(self) -> None:
        self.registry.unregister(self)


def serve(port: int, addr: str = "127.0.0.1", registry=None):
    """Start prometheus_client's metrics HTTP server on ``addr:port`` in a daemon thread.

    Binds to localhost by default: allocator figures are for the scraper on
    this machine, not the network. Returns what ``start_http_server`` returns
    (the server and its thread in prometheus_client >= 0.17).
    """
    from prometheus_client import REGISTRY, start_http_server

    return start_http_server(port, addr=addr, registry=registry if registry is not None else REGISTRY)


@dataclass(frozen=True)
class Decision:
    """Whether to recycle the worker, and why, with the figures; ``rule`` names the rule that fired."""

    restart: bool
    reason: str
    rule: str = ""


class RestartPolicy:
    """When to recycle a long-lived worker, from its allocator statistics.

    Rules, checked in this order (the first that fires decides):

    1. any OOM happened: the allocator's state after an OOM is the state that
       produced it, and the next request of that size fails again;
    2. cache-flush retries are frequent (more than ``max_retries_per_hour``):
       each retry means the allocator had to free its whole cache to find
       room, one step short of an OOM;
    3. non-releasable bytes exceed ``max_non_releasable_bytes``: free memory
       pinned inside segments that no ``empty_cache()`` can return, which only
       a fresh process gives back;
    4. fragmentation (``1 - allocated/reserved``) is above ``max_fragmentation``:
       the worker holds memory it cannot use for large requests;
    5. uptime exceeds ``max_uptime_s``: a scheduled recycle bounds whatever
       slow drift the other rules miss.

    Rules 3 and 4 wait for ``min_uptime_s``: a worker warming up (first
    batches, growing caches) shows both briefly, and restarting it then would
    only restart it again. Call :meth:`decide` periodically and act on
    ``restart`` at a safe point (between requests or steps).
    """

    def __init__(
        self,
        max_fragmentation: float = 0.5,
        max_non_releasable_bytes: int | None = None,
        max_retries_per_hour: float = 10,
        min_uptime_s: float = 600,
        max_uptime_s: float | None = None,
    ):
        self.max_fragmentation = max_fragmentation
        self.max_non_releasable_bytes = max_non_releasable_bytes
        self.max_retries_per_hour = max_retries_per_hour
        self.min_uptime_s = min_uptime_s
        self.max_uptime_s = max_uptime_s

    def decide(self, stats: dict, uptime_s: float, retries_in_last_hour: int | None = None) -> Decision:
        """Restart or not, from a flat ``memory_stats()`` dict and the worker's uptime.

        ``retries_in_last_hour`` comes from a :class:`RetryRate`; without it the
        process's total retries are spread over its uptime (at least an hour,
        so a young worker's few retries count in full).
        """
        ooms = int(stats.get(OOMS, 0))
        retries = int(stats.get(RETRIES, 0))
        frag = fragmentation(stats)
        non_releasable = int(stats.get(NON_RELEASABLE, 0))
        if retries_in_last_hour is None:
            rate = retries * HOUR_S / max(uptime_s, HOUR_S)
        else:
            rate = float(retries_in_last_hour)
        warmed_up = uptime_s >= self.min_uptime_s

        if ooms > 0:
            return Decision(
                True, f"{ooms} out-of-memory error(s) happened: the allocator's state that caused them persists", "oom"
            )
        if rate > self.max_retries_per_hour:
            return Decision(
                True,
                f"{rate:g} cache-flush retries per hour (max {self.max_retries_per_hour:g}): each was one step short of an OOM",
                "retries",
            )
        if warmed_up and self.max_non_releasable_bytes is not None and non_releasable > self.max_non_releasable_bytes:
            return Decision(
                True,
                f"{non_releasable / MIB:,.0f} MiB non-releasable (max {self.max_non_releasable_bytes / MIB:,.0f} MiB): "
                "free memory pinned inside segments that only a fresh process returns",
                "non_releasable",
            )
        if warmed_up and frag > self.max_fragmentation:
            return Decision(
                True,
                f"fragmentation {frag:.0%} (max {self.max_fragmentation:.0%}): "
                f"{stats.get(RESERVED, 0) / MIB:,.0f} MiB reserved for {stats.get(ALLOCATED, 0) / MIB:,.0f} MiB allocated",
                "fragmentation",
            )
        if self.max_uptime_s is not None and uptime_s > self.max_uptime_s:
            return Decision(
                True,
                f"up {uptime_s / HOUR_S:,.1f} h, past the scheduled recycle at {self.max_uptime_s / HOUR_S:,.1f} h",
                "max_uptime",
            )

        waiting = "" if warmed_up else f", warming up (fragmentation and non-releasable rules start at {self.min_uptime_s:g} s)"
        return Decision(
            False,
            f"healthy: fragmentation {frag:.0%} (max {self.max_fragmentation:.0%}), "
            f"{non_releasable / MIB:,.0f} MiB non-releasable, {rate:g} retries per hour (max {self.max_retries_per_hour:g}), "
            f"no OOMs, up {uptime_s:,.0f} s{waiting}",
            "",
        )


class RetryRate:
    """Turns successive ``num_alloc_retries`` readings into retries per hour over a sliding window.

    ``num_alloc_retries`` only grows during a process's life; a smaller
    reading means the counter started again (a new process), and counts from
    zero, as Prometheus' ``rate()`` treats counter resets.
    """

    def __init__(self, window_s: float = HOUR_S):
        self.window_s = window_s
        self._readings: list[tuple[float, int]] = []  # (time, retries counted since the first reading, resets included)
        self._last_raw: int | None = None

    def add(self, retries: int, at: float | None = None) -> None:
        """Record a reading of ``num_alloc_retries`` taken at ``at`` (seconds; ``time.monotonic()`` by default)."""
        at = time.monotonic() if at is None else float(at)
        retries = int(retries)
        if self._last_raw is None:
            total = 0
        else:
            grew = retries - self._last_raw if retries >= self._last_raw else retries
            total = self._readings[-1][1] + grew
        self._last_raw = retries
        self._readings.append((at, total))
        # Keep one reading at or before the window's start: it is the baseline.
        start = at - self.window_s
        while len(self._readings) >= 2 and self._readings[1][0] <= start:
            self._readings.pop(0)

    def _baseline(self) -> tuple[float, int] | None:
        if len(self._readings) < 2:
            return None
        return self._readings[0]

    def count(self) -> int:
        """Retries between the window's baseline reading and the latest: use as ``retries_in_last_hour``."""
        base = self._baseline()
        return 0 if base is None else self._readings[-1][1] - base[1]

    def per_hour(self) -> float:
        """Retries per hour between the baseline reading and the latest; 0 with fewer than two readings."""
        base = self._baseline()
        if base is None:
            return 0.0
        span = self._readings[-1][0] - base[0]
        return 0.0 if span <= 0 else self.count() * HOUR_S / span
