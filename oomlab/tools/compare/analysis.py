"""Two allocator snapshots side by side: what grew, by line and by holder. Pure functions over plain data.

Each snapshot becomes a *side* (see :mod:`oomlab.tools.compare.sides` for where
the data comes from)::

    {"label": "feature-cache", "source": "run" | "pickle" | "result", "path": "where it came from",
     "ended": "OOM at train.py:31" | "finished" (a run's) | "OOM recorded" | "no OOM recorded" (a file's),
     "headline": what the snapshot tool said about it,
     "figures": {"allocated", "reserved", "non_releasable", "segments", "peak_allocated", "peak_reserved"},
     "peak_source": "allocator" | "history" | None,
     "sites": [{"label", "file", "line", "function", "code", "bytes", "blocks"}, ...],
     "sites_complete": True when ``sites`` covers every live block,
     "holders": the hunt's holders, or None, "holders_complete": True when the hunt listed them all,
     "notes": [...]}

:func:`live_sites` adds up a snapshot's live blocks by allocation site,
:func:`figures_of` reads a snapshot result's totals, :func:`match_sites` and
:func:`match_holders` pair the two sides up, and :func:`compare` is the tool's
JSON-ready result. Every change is B minus A: run ``compare BUG FIX`` and the
fix's savings show as shrinkage, ``compare YESTERDAY TODAY`` and a new leak
shows as growth.

How a site of A is matched to a site of B
-----------------------------------------

Two snapshots of different code (a bug and its fix, yesterday's script and
today's) put the same allocation on another line number as soon as a line
above it was added or removed, and the file may sit in another folder
(``exercises/ID/train.py`` and ``solutions/ID/train.py``). So sites are
matched in this order, each site at most once:

1. **by line text**: the same file *name* (the folder does not count), the same
   function, the same source line (spaces collapsed). Where one text occurs
   several times in a function, the occurrences pair up in line order;
2. **by file and line**: the same file name and line number, but only where at
   least one of the two sides lacks its line text (the source was not at hand
   when it was read). Two lines whose texts are both known and differ are
   different code and never match;
3. allocations with no Python frame of the script (the backward pass, C++
   internals) match by their label.

A site matched in neither way is only in A or only in B: its bytes on the
other side count as zero.
"""

from __future__ import annotations

import linecache
import os

from oomlab.figure_names import NAMES
from oomlab.tools.compare import DEFAULT_TOP
from oomlab.tools.hunt.analysis import stable_name
from oomlab.tools.snapshot.analysis import LIVE, allocation_site, site_text, state_of
from oomlab.units import format_bytes

__all__ = [
    "FIGURES",
    "SHAREABLE_KEYS",
    "TOOL",
    "compare",
    "figures_of",
    "live_sites",
    "match_holders",
    "match_sites",
    "shareable",
    "signed_bytes",
    "site_change",
]

TOOL = "compare"
BY_TEXT, BY_LINE, BY_LABEL, ONLY_A, ONLY_B = "line text", "file and line", "label", "only in A", "only in B"

# The figures set side by side (their names and meanings: oomlab.figure_names), and whether each is a byte count.
FIGURES = (
    ("allocated", True),
    ("reserved", True),
    ("non_releasable", True),
    ("segments", False),
    ("peak_allocated", True),
    ("peak_reserved", True),
)


# What of a result a report that leaves this machine keeps (the course site's figures.json does): the keys of each
# part, none of them a folder or an absolute file of the machine that ran it. They live here, beside the result they
# are keys of, so that a key renamed in the result is renamed in what is shared, and nobody keeps a copy of the list.
SHAREABLE_KEYS = {
    "result": ("kind", "headline"),
    "side": ("label", "ended", "headline"),
    "figure": ("figure", "name", "meaning", "bytes", "a", "b", "change"),
    "site": ("site", "code", "bytes_a", "bytes_b", "growth", "matched_by"),
    "holder": ("holder", "bytes_a", "bytes_b", "growth", "path"),
}


def signed_bytes(n: int | None) -> str:
    """A change in bytes with its sign: ``+20.0 MiB``, ``-1.5 KiB``, ``0 B``; ``n/a`` without a figure."""
    if n is None:
        return "n/a"
    return f"+{format_bytes(n)}" if n > 0 else format_bytes(n)


# --------------------------------------------------------------------------- one side


def live_sites(snapshot: dict, script: str | None = None, root: str | None = None, known_code: dict | None = None) -> list[dict]:
    """Live bytes and blocks by allocation site (one row per file, line and function), in file and line order.

    ``snapshot`` is normalized (:func:`oomlab.tools.snapshot.analysis.load_snapshot`
    does that). A site is :func:`~oomlab.tools.snapshot.analysis.allocation_site`'s:
    the innermost frame in ``script``, else outside torch and libraries. Its
    ``code`` is, first, what ``known_code`` (site label -> line text) says: the
    text read when the snapshot was taken, since the file may have changed
    since; else the line as it is now, with a relative file name (a shared
    snapshot's) read under ``root``.
    """
    known_code = known_code or {}
    by_site: dict[tuple, dict] = {}
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if state_of(block["state"]) != LIVE:
                continue
            site = allocation_site(block["frames"], script)
            key = (site["file"], site["line"], site["function"], site["label"])
            row = by_site.get(key)
            if row is None:
                code = known_code.get(site["label"]) or site["code"] or _source_line(site, root)
                row = by_site[key] = {**site, "code": code, "bytes": 0, "blocks": 0}
            row["bytes"] += int(block["size"])
            row["blocks"] += 1
    return sorted(by_site.values(), key=_position)


def _source_line(site: dict, root: str | None) -> str:
    """The line of a site whose file name is relative (as in a shared snapshot), read under ``root``; "" when not there."""
    if not site["file"] or not site["line"] or not root or os.path.isabs(site["file"]):
        return ""
    return linecache.getline(os.path.join(root, site["file"]), site["line"]).strip()


def figures_of(result: dict) -> tuple[dict, str | None]:
    """The figures of :data:`FIGURES` from a snapshot result (``analyze()``'s, or a ``snapshot.json``), and the peaks' source.

    The peaks are the allocator's own counters where the result has them
    (``allocator_stats``, from a run of the snapshot tool), else the recorded
    history's highest point, else unknown (None).
    """
    totals, stats, history = result["totals"], result.get("allocator_stats") or {}, result.get("timeline") or {}
    figures = {key: totals.get(key) for key in ("allocated", "reserved", "non_releasable", "segments")}
    if stats.get("peak_allocated") is not None:
        source, peak_allocated, peak_reserved = "allocator", stats["peak_allocated"], stats.get("peak_reserved")
    elif history.get("events"):
        source, peak_allocated, peak_reserved = "history", history.get("peak_allocated"), history.get("peak_reserved")
    else:
        source, peak_allocated, peak_reserved = None, None, None
    return {**figures, "peak_allocated": peak_allocated, "peak_reserved": peak_reserved}, source


# --------------------------------------------------------------------------- matching


def match_sites(sites_a: list[dict], sites_b: list[dict]) -> list[dict]:
    """Pair the sites of A and B (the rule is in this module's docstring); one row per pair or lone site.

    Each row: ``site`` (how to show it), ``site_a`` and ``site_b`` (each side's
    label, None where absent), ``function``, ``code``, ``bytes_a``, ``bytes_b``,
    ``blocks_a``, ``blocks_b``, ``growth`` (B minus A) and ``matched_by``.
    """
    left_a, left_b = sorted(sites_a, key=_position), sorted(sites_b, key=_position)
    pairs: list[tuple[dict | None, dict | None, str]] = []
    for key, rule in ((_text_key, BY_TEXT), (_line_key, BY_LINE), (_label_key, BY_LABEL)):
        waiting: dict[tuple, list[dict]] = {}
        for site in left_b:
            if (k := key(site)) is not None:
                waiting.setdefault(k, []).append(site)
        still_a = []
        for site in left_a:
            candidates = waiting.get(key(site), [])
            partner = next((b for b in candidates if _may_pair(site, b, rule)), None)
            if partner is None:
                still_a.append(site)
                continue
            candidates.remove(partner)
            pairs.append((site, partner, rule))
        paired_b = {id(b) for _, b, _ in pairs}
        left_a, left_b = still_a, [b for b in left_b if id(b) not in paired_b]
    pairs += [(a, None, ONLY_A) for a in left_a] + [(None, b, ONLY_B) for b in left_b]
    return [_site_row(a, b, rule) for a, b, rule in pairs]


def _position(site: dict) -> tuple:
    return (site.get("file") or "", site.get("line") or 0, site.get("function") or "", site.get("label") or "")


def _text_key(site: dict) -> tuple | None:
    code = " ".join((site.get("code") or "").split())
    if not site.get("file") or not code:
        return None
    return (os.path.basename(site["file"]), site.get("function"), code)


def _line_key(site: dict) -> tuple | None:
    return (os.path.basename(site["file"]), site.get("line")) if site.get("file") else None


def _label_key(site: dict) -> tuple | None:
    return None if site.get("file") else (site.get("label"),)


def _may_pair(a: dict, b: dict, rule: str) -> bool:
    """Only by line text may two sites whose texts are both known pair up: differing known texts are different code."""
    return rule != BY_LINE or not (a.get("code") and b.get("code"))


def _site_row(a: dict | None, b: dict | None, rule: str) -> dict:
    either = b or a
    label_a, label_b = (a or {}).get("label"), (b or {}).get("label")
    if label_a and label_b and label_a != label_b:
        shown = f"{label_a} → {label_b}"  # the same code moved: both line numbers, so each file can be opened there
    else:
        shown = label_b or label_a
    bytes_a, bytes_b = (a or {}).get("bytes", 0), (b or {}).get("bytes", 0)
    return {
        "site": shown,
        "site_a": label_a,
        "site_b": label_b,
        "file": either.get("file"),
        "function": either.get("function"),
        "code": either.get("code") or (a or {}).get("code") or "",
        "bytes_a": bytes_a,
        "bytes_b": bytes_b,
        "blocks_a": (a or {}).get("blocks", 0),
        "blocks_b": (b or {}).get("blocks", 0),
        "growth": bytes_b - bytes_a,
        "matched_by": rule,
    }


def match_holders(holders_a: list[dict], holders_b: list[dict]) -> list[dict]:
    """The hunt's holders of A and B paired by name without line (:func:`~oomlab.tools.hunt.analysis.stable_name`).

    A holder is a root (a global, a function's local) and what it reaches, so
    the same name in both runs is the same variable, wherever its line moved.
    Rows, most grown first: ``holder`` (as the hunt describes it), ``name``,
    ``bytes_a``, ``bytes_b``, ``growth``, ``path`` (the reference path to its
    largest tensor, B's where B has it) and each side's ``label`` (culprit,
    model/optimizer state, ...).
    """
    rows: dict[str, dict] = {}
    for side, holders in (("a", holders_a), ("b", holders_b)):
        for h in holders:
            name = stable_name(h["name"])
            row = rows.setdefault(name, {"name": name, "bytes_a": 0, "bytes_b": 0, "label_a": None, "label_b": None})
            row[f"bytes_{side}"] += int(h["bytes"])
            row[f"label_{side}"] = h.get("label") or None
            row["holder"] = h.get("what") or h["name"]
            row["path"] = h.get("largest_path") or row.get("path") or ""
    for row in rows.values():
        row["growth"] = row["bytes_b"] - row["bytes_a"]
    return sorted(rows.values(), key=lambda r: (-r["growth"], r["name"]))


# --------------------------------------------------------------------------- the result


def compare(a: dict, b: dict, top: int = DEFAULT_TOP) -> dict:
    """The comparison of side ``a`` with side ``b``: figures side by side, and what grew and shrank, by site and by holder.

    Returns ``compare.json``: ``kind`` (``grew``, ``shrank`` or ``same``: B's
    live bytes against A's), ``headline``, ``culprit_bytes`` (the largest growth
    of one site, 0 when none grew), ``sides`` (each side's label, source,
    ending and headline), ``figures`` (one row per :data:`FIGURES` entry with
    ``a``, ``b`` and ``change``), ``grown`` and ``shrunk`` (the ``top`` sites
    that changed most each way, see :func:`match_sites`), ``unchanged_sites``,
    ``holders`` (see :func:`match_holders`; None unless both sides were hunted)
    and ``notes``.
    """
    notes = [f"A: {note}" for note in a.get("notes", [])] + [f"B: {note}" for note in b.get("notes", [])]
    figures = []
    for key, in_bytes in FIGURES:
        va, vb = a["figures"].get(key), b["figures"].get(key)
        change = None if va is None or vb is None else vb - va
        figures.append(
            {
                "figure": key,
                "name": NAMES[key].label,
                "meaning": NAMES[key].meaning,
                "bytes": in_bytes,
                "a": va,
                "b": vb,
                "change": change,
            }
        )
    if a.get("peak_source") != b.get("peak_source") and a.get("peak_source") and b.get("peak_source"):
        notes.append(
            f"The peaks come from A's {_PEAK_SOURCES[a['peak_source']]} and B's {_PEAK_SOURCES[b['peak_source']]}: "
            "the history counts requested bytes, the allocator's counters rounded ones, so a small difference is no change."
        )

    rows = match_sites(a["sites"], b["sites"])
    grown = sorted((r for r in rows if r["growth"] > 0), key=lambda r: (-r["growth"], r["site"]))
    shrunk = sorted((r for r in rows if r["growth"] < 0), key=lambda r: (r["growth"], r["site"]))
    for letter, side in (("A", a), ("B", b)):
        if not side.get("sites_complete", True):
            notes.append(
                f"{letter}'s sites come from its result file, which lists only the largest; a site it leaves out counts "
                "as 0 there. The snapshot.pickle beside the result gives every site."
            )

    holders = None
    if a.get("holders") is not None and b.get("holders") is not None:
        holders = match_holders(a["holders"], b["holders"])
        if not (a.get("holders_complete", True) and b.get("holders_complete", True)):
            notes.append("The hunt lists only the largest holders: a holder missing from one list counts as 0 there.")
    elif a.get("holders") is not None or b.get("holders") is not None:
        notes.append("Only one side was hunted, so there is no comparison by holder.")

    allocated = next(f for f in figures if f["figure"] == "allocated")
    change = allocated["change"] or 0
    kind = "grew" if change > 0 else ("shrank" if change < 0 else "same")
    return {
        "tool": TOOL,
        "kind": kind,
        "headline": _headline(kind, allocated, grown, shrunk),
        "culprit_bytes": grown[0]["growth"] if grown else 0,
        "sides": {letter: _side_summary(side) for letter, side in (("a", a), ("b", b))},
        "figures": figures,
        "grown": grown[:top],
        "grown_left_out": max(0, len(grown) - top),
        "shrunk": shrunk[:top],
        "shrunk_left_out": max(0, len(shrunk) - top),
        "unchanged_sites": len(rows) - len(grown) - len(shrunk),
        "holders": holders,
        "notes": notes,
    }


_PEAK_SOURCES = {"allocator": "allocator counters", "history": "recorded history"}


def shareable(result: dict, holders: int | None = None) -> dict:
    """What of :func:`compare`'s result may leave the machine that ran it: the parts of :data:`SHAREABLE_KEYS`.

    Each side keeps its label, how it ended and its headline, not the folder it was read from; each site
    its label and line of code, not its absolute file. ``holders`` keeps only the first that many holders
    (the most grown), all of them when None.
    """
    keys = SHAREABLE_KEYS
    return {
        **{k: result[k] for k in keys["result"]},
        "sides": {letter: {k: side[k] for k in keys["side"]} for letter, side in result["sides"].items()},
        "figures": [{k: f[k] for k in keys["figure"]} for f in result["figures"]],
        **{way: [{k: r[k] for k in keys["site"]} for r in result[way]] for way in ("grown", "shrunk")},
        "holders": None
        if result["holders"] is None
        else [{k: r[k] for k in keys["holder"]} for r in result["holders"][:holders]],
    }


def _side_summary(side: dict) -> dict:
    keys = ("label", "source", "path", "ended", "headline", "peak_source", "sites_complete")
    return {key: side.get(key) for key in keys} | {"hunted": side.get("holders") is not None}


def site_change(row: dict) -> str:
    """A site row in a sentence: ``train.py:31 (features.append(encoder(x))) -800.0 MiB``."""
    return f"{site_text({'label': row['site'], 'code': row['code']})} {signed_bytes(row['growth'])}"


def _headline(kind: str, allocated: dict, grown: list, shrunk: list) -> str:
    a, b = allocated["a"], allocated["b"]
    if kind == "same":
        lead = f"A and B hold the same live memory ({format_bytes(a)})"
    else:
        lead = f"B holds {format_bytes(abs(b - a))} {'more' if kind == 'grew' else 'less'} live memory than A ({format_bytes(a)} → {format_bytes(b)})"
    # The biggest change either way, and the biggest the other way when there is one: a fix that frees 800 MiB
    # at one line and adds 20 MiB at another shows both.
    first, second = (grown, shrunk) if kind == "grew" else (shrunk, grown)
    parts = [f"most {'grown' if rows is grown else 'shrunk'}: {site_change(rows[0])}" for rows in (first, second) if rows]
    if not parts:
        return f"{lead}; no allocation site changed."
    return f"{lead}; " + "; ".join(parts) + "."
