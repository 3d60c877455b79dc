"""The recorded OOM message on the site: what a learner alone sees, and each clause explained from its own figures."""

from oomlab.site.oom_message import annotated, clauses, learner_view

LINKS = {"sizes": "allocator.md#sizes", "fraction": "allocator.md#fraction", "expandable": "allocator.md#settings"}

# The shape of a message recorded on an H200 under a 2 GiB cap, with made-up process numbers.
FRAGMENTED = (
    "CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 116.69 GiB "
    "is free. Process 11 has 6.30 GiB memory in use. Including non-PyTorch memory, this process has 2.72 GiB memory "
    "in use. Process 12 has 5.05 GiB memory in use. 2.00 GiB allowed; Of the allocated memory 1.31 GiB is allocated "
    "by PyTorch, and 708.63 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
FULL = FRAGMENTED.replace("1.31 GiB is allocated", "1.99 GiB is allocated").replace(
    "708.63 MiB is reserved", "8.00 MiB is reserved"
)


def test_the_other_processes_lines_are_left_out_and_counted():
    shown, others = learner_view(FRAGMENTED)
    assert others == 2 and "Process 1" not in shown
    assert "Including non-PyTorch memory, this process has 2.72 GiB memory in use. 2.00 GiB allowed;" in shown
    assert "  " not in shown  # the gaps the left-out lines leave are closed
    assert learner_view("CUDA out of memory. Tried to allocate 2.00 MiB.") == (
        "CUDA out of memory. Tried to allocate 2.00 MiB.",
        0,
    )


def test_every_clause_is_found_in_order_with_its_figures_in_bytes():
    found = clauses(FRAGMENTED)
    assert [c.kind for c in found] == ["request", "device", "process", "allowed", "split", "advice"]
    by_kind = {c.kind: c for c in found}
    assert by_kind["request"].sizes == (128 << 20,)
    assert by_kind["split"].sizes == (round(1.31 * (1 << 30)), round(708.63 * (1 << 20)))
    assert by_kind["split"].said == ("1.31 GiB", "708.63 MiB")
    assert by_kind["allowed"].sizes == (2 << 30,)


def test_a_cache_larger_than_the_request_is_read_as_fragmentation():
    text = "\n".join(annotated(learner_view(FRAGMENTED)[0], LINKS))
    assert "the free memory is in pieces" in text and "708.63 MiB against 128.00 MiB" in text
    assert "no room for a new segment of 128.00 MiB" in text
    assert "outside the allocator" in text  # 2.72 GiB in use, 2.00 GiB reserved
    for link in LINKS.values():
        assert f"]({link})" in text


def test_a_small_cache_points_to_live_tensors_not_fragmentation():
    text = "\n".join(annotated(learner_view(FULL)[0], LINKS))
    assert "the free memory is in pieces" not in text and "live tensors fill the reserved memory" in text


def test_a_message_without_the_cap_or_the_driver_figures_explains_what_it_has():
    bare = "CUDA out of memory. Tried to allocate 20.00 MiB. Of the allocated memory 10.00 MiB is allocated by PyTorch, and 30.00 MiB is reserved by PyTorch but unallocated."
    text = "\n".join(annotated(bare, LINKS))
    assert "`Tried to allocate 20.00 MiB.`" in text and "the free memory is in pieces" in text
    assert "allowed" not in text and "NVML" not in text
    assert annotated("RuntimeError: something else", LINKS) == []
