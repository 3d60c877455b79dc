"""The measuring child's guards, on a stand-in for torch: which calls become recorded no-ops, and when."""

from __future__ import annotations

from types import SimpleNamespace

from oomlab.measure.child import install_guards


def fake_torch():
    calls = []
    c = SimpleNamespace(
        _cuda_memoryStats=lambda device: {"allocated_bytes": {}},
        _cuda_resetPeakMemoryStats=lambda device: calls.append("reset peak"),
        _cuda_resetAccumulatedMemoryStats=lambda device: calls.append("reset accumulated"),
        _cuda_setMemoryFraction=lambda *a: calls.append("fraction"),
        _cuda_cudaCachingAllocator_set_allocator_settings=lambda s: calls.append(f"settings {s}"),
    )
    return SimpleNamespace(_C=c, cuda=SimpleNamespace(current_device=lambda: 0)), calls


def test_guards_refuse_every_call_that_would_falsify_the_figures():
    torch, calls = fake_torch()
    tamper: list[str] = []
    install_guards(torch, tamper)
    calls.clear()  # the guards reset the statistics once, before the script
    torch._C._cuda_resetPeakMemoryStats(0)
    torch._C._cuda_setMemoryFraction(1.0, 0)
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings("expandable_segments:True")
    assert calls == []
    assert len(tamper) == 3 and any("allocator settings" in t for t in tamper)


def test_where_settings_are_the_scripts_to_change_they_still_work():
    torch, calls = fake_torch()
    tamper: list[str] = []
    install_guards(torch, tamper, settings_free=True)
    calls.clear()
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings("expandable_segments:True")
    torch._C._cuda_resetPeakMemoryStats(0)
    assert calls == ["settings expandable_segments:True"]
    assert len(tamper) == 1 and "peak" in tamper[0]
