"""How many collectives a process issued on its default process group, whoever issued them.

A script's own calls go through ``torch.distributed`` and could be counted by wrapping it; DDP's
reducer and FSDP's hooks call the process group from C++, where no Python wrapper sees them. The
group counts every collective itself, its sequence number, which is what ranks compare: ranks
that issued different numbers no longer pair their collectives up (an OOM caught and skipped on
one rank, say). :func:`keep_counting` holds on to each default group as it is made and reads its
number just before it is destroyed, however the script names it, so that a group destroyed, or
destroyed and made again, neither hides the count nor starts it over; :func:`at_end` adds them up.
Standard library and torch only: each rank of a torchrun job the tools run
(:mod:`oomlab.measure.rank_child`) uses it.
"""

from __future__ import annotations

import functools

__all__ = ["at_end", "issued", "keep_counting"]


def _count(group) -> int | None:
    try:
        return int(group._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a torch without the number, or a group torn down: nothing to read
        return None


def _default_group():
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_group() if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - no default group
        return None


def issued() -> int | None:
    """Collectives issued on the live default process group so far; None before ``init_process_group``."""
    group = _default_group()
    return None if group is None else _count(group)


def keep_counting(kept: dict) -> None:
    """Keep each default group in ``kept["group"]`` as ``init_process_group`` makes it, and add its count to
    ``kept["issued"]`` just before it is destroyed (``destroy_process_group()``, or of the group by name)."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except ImportError:
        return
    if not dist.is_available():
        return
    init, destroy = distributed_c10d.init_process_group, distributed_c10d.destroy_process_group

    @functools.wraps(init)
    def initializing(*args, **kwargs):
        result = init(*args, **kwargs)
        kept["group"] = _default_group()
        return result

    @functools.wraps(destroy)
    def destroying(group=None, *args, **kwargs):
        live = kept.get("group")
        if live is not None and (group is None or group is live or group == live):
            kept["issued"] = kept.get("issued", 0) + (_count(live) or 0)
            kept["group"] = None
        return destroy(group, *args, **kwargs)

    for module in (dist, distributed_c10d):
        module.init_process_group, module.destroy_process_group = initializing, destroying


def at_end(kept: dict) -> int | None:
    """Every collective issued on the default groups the script made: those destroyed and the one still live; None
    if it never made one."""
    live = kept.get("group")
    if live is None and "issued" not in kept:
        return None
    return kept.get("issued", 0) + ((_count(live) or 0) if live is not None else 0)
