"""The CUDA caching allocator as the OOM hook sees it: which devices it served, its history, its snapshot.

Everything the hook asks ``torch.cuda`` goes through :class:`CudaAllocator`,
so the rest of the hook works on plain data and the tests hand it a torch
whose ``cuda`` is a fake (several devices, synthetic snapshots) on a machine
with no GPU.

One caching allocator serves every device of the process: a device that was
never used has no activity in its statistics (``memory_stats(n)`` reads the
allocator's counters, not the device), history recording is switched on and off for
all devices at once, and one ``_snapshot()`` holds the segments of every
device (each segment names its ``device``) and one history per device.
"""

from __future__ import annotations

import inspect

from oomlab.measure.stats import FIGURES, read_figures

__all__ = ["STACKS", "CudaAllocator"]

STACKS = ("python", "all")  # what _record_memory_history records per event: Python frames, or C++ frames too


class CudaAllocator:
    """``torch.cuda``'s allocator: devices with activity, history on and off, snapshot and statistics."""

    def __init__(self, torch):
        self.torch = torch

    def device_count(self) -> int:
        """How many CUDA devices torch sees; 0 on a CPU-only build or a machine without a GPU."""
        try:
            return int(self.torch.cuda.device_count())
        except Exception:  # noqa: BLE001 - a broken driver is "no device" to a hook that must not fail
            return 0

    def active_devices(self) -> list[int]:
        """The devices the allocator has reserved memory on, or failed to, since the process started.

        The peak, not the current figure: a device whose cache ``empty_cache()``
        emptied was still used, and an OOM on the very first request reserves nothing.
        """
        if not self.torch.cuda.is_initialized():
            return []  # memory_stats() of an uninitialised CUDA is {} anyway; say so without asking each device
        active = []
        for device in range(self.device_count()):
            figures = read_figures(self.stats(device))
            if figures["peak_reserved"] > 0 or figures["ooms"] > 0:
                active.append(device)
        return active

    def stats(self, device: int) -> dict:
        """``torch.cuda.memory_stats(device)``: the flat dict of the allocator's counters for that device."""
        return dict(self.torch.cuda.memory_stats(device))

    def allocator_stats(self, device: int, names: dict[str, str]) -> dict:
        """``{name: figure}`` for ``names`` (result name -> :data:`~oomlab.measure.stats.FIGURES` name) this torch reports."""
        raw = self.stats(device)
        return {name: int(raw[FIGURES[fig]]) for name, fig in names.items() if FIGURES[fig] in raw}

    def history_enabled(self) -> bool:
        """Whether allocation history is being recorded now (by us or by the script); False where torch cannot say.

        Before CUDA is initialised nothing can be recording (the allocator records
        for the devices it was set up for), and torch must not be asked then: it
        reads the current device's allocator, which does not exist yet, and the
        process dies of a segmentation fault (torch 2.11 on an H200).
        """
        is_enabled = getattr(self.torch._C, "_cuda_isHistoryEnabled", None)
        try:
            if is_enabled is None or not self.torch.cuda.is_initialized():
                return False
            return bool(is_enabled())
        except Exception:  # noqa: BLE001
            return False

    def start_history(self, max_entries: int, stacks: str) -> None:
        """Record every allocation and free with its stack, keeping the last ``max_entries`` events.

        CUDA is initialised first: the allocator records for the devices it
        was set up for, and a script that enters the hook before its first
        CUDA call would otherwise record nothing. Parameters this torch's
        ``_record_memory_history`` does not take are left at its defaults.
        """
        self.torch.cuda.init()
        record = self.torch.cuda.memory._record_memory_history
        wanted = {"enabled": "all", "context": "all", "stacks": stacks, "max_entries": int(max_entries)}
        try:
            accepted = inspect.signature(record).parameters
            kwargs = {name: value for name, value in wanted.items() if name in accepted}
        except (TypeError, ValueError):  # no signature to read: pass what every torch from 2.4 on takes
            kwargs = {"max_entries": int(max_entries)}
        record(**kwargs)

    def stop_history(self) -> None:
        """Stop recording and free the recorded history (it lives in host memory, not on the GPU)."""
        self.torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()``: every device's segments and blocks, and each device's history."""
        return self.torch.cuda.memory._snapshot()
