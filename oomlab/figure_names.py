"""What each allocator figure is called wherever the course shows it, and what it means, in one place.

The terminal's figures table, the maintainers' tables, the compare tool and the
site's tables all name the same few figures; a learner who reads "non-releasable"
in one should find the same word, with the same meaning, in the others. The keys
are the course's names for the figures (``oomlab.measure.stats.FIGURES`` maps
them to ``torch.cuda.memory_stats()`` keys), plus the current figures a snapshot
gives (``allocated``, ``reserved``, ``non_releasable``, ``segments``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMPARED", "NAMES", "FigureName", "heading", "label"]


@dataclass(frozen=True)
class FigureName:
    label: str  # lower case, as it reads inside a sentence or a terminal table
    meaning: str  # one line, for a table's "what it means" column


NAMES: dict[str, FigureName] = {
    "peak_allocated": FigureName("peak allocated", "the most memory live tensors held at once"),
    "peak_reserved": FigureName("peak reserved", "the most the allocator held from the GPU at once, cache included"),
    "inactive_split_peak": FigureName(
        "peak non-releasable", "the most free memory stranded at once in segments that live blocks pin (inactive split)"
    ),
    # A retry frees only the cached blocks that are not split, not the whole cache (c10's
    # release_cached_blocks after a failed cudaMalloc): segments that a live block pins stay.
    "retries": FigureName(
        "retries", "times cudaMalloc failed and the allocator gave back its unsplit cached blocks to try again"
    ),
    "ooms": FigureName("OOMs", "out-of-memory errors raised"),
    "allocated": FigureName("allocated", "in live blocks (tensors)"),
    "reserved": FigureName("reserved", "held from the GPU by the allocator"),
    "non_releasable": FigureName("non-releasable", "free, in segments a live block pins (inactive split)"),
    "segments": FigureName("segments", "cudaMalloc'd segments the allocator holds"),
}


# The figures a run is judged and compared by: the truth check's repeatability, the maintainers' tables.
COMPARED = ("peak_allocated", "peak_reserved", "inactive_split_peak", "retries")


def label(key: str, unit: str = "") -> str:
    """The figure's name in a sentence or a terminal column: ``peak reserved``, ``peak reserved MiB``."""
    return f"{NAMES[key].label} {unit}".strip()


def heading(key: str) -> str:
    """The figure's name as a table heading on the site: ``Peak reserved``."""
    text = NAMES[key].label
    return text[0].upper() + text[1:]
