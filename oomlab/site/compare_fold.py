"""What the reference fix changed, measured: ``oomlab compare`` of an exercise's bug and fix, folded on its page.

``oomlab dev figures`` runs the snapshot and the hunt on the buggy script and on
the reference fix and compares them (``compares`` in ``figures.json``, see
:mod:`oomlab.site.figures`). :func:`compare_fold` turns one entry into the fold
that follows the fix: the figures side by side, the lines whose live memory
changed most, the holders, and the picture. It gives the answer away, so it is
folded, after the fix.
"""

from __future__ import annotations

from oomlab.site.markdown import cell, escaped, indented, picture
from oomlab.tools.compare.analysis import signed_bytes
from oomlab.units import format_bytes

__all__ = ["COMPARE_FOLD", "compare_fold"]

COMPARE_FOLD = "What the fix changed, measured by oomlab compare"


def compare_fold(entry: dict | None, ex_id: str, solution: str, page_uri: str, drawn_on: str) -> list[str]:
    """The fold for one exercise's entry of ``figures.json``'s ``compares`` (nothing when it has none)."""
    if not entry:
        return []
    a, b = entry["sides"]["a"], entry["sides"]["b"]
    body = [
        f"`oomlab compare {ex_id} {solution}`, run by `oomlab dev figures` on {drawn_on}: A is the buggy script "
        f"({escaped(a['ended'])}), B the reference fix ({escaped(b['ended'])}), each under the exercise's budget, "
        "with the snapshot taken where the run ended. Every change is B minus A, so what the fix saves shows as a "
        "negative change.",
        "",
        "> " + escaped(entry["headline"]),
        "",
        "| Figure | Bug (A) | Fix (B) | Change |",
        "|---|---:|---:|---:|",
        *(
            f"| {f['name']} ({cell(f['meaning'])}) | {_amount(f, f['a'])} | {_amount(f, f['b'])} | {_change(f)} |"
            for f in entry["figures"]
            if f["a"] is not None or f["b"] is not None
        ),
        "",
    ]
    for way, title in (("shrunk", "Shrank most"), ("grown", "Grew most")):
        if entry[way]:
            body += [
                f"**{title}**, live memory by the line that allocated it:",
                "",
                "| Line | Code | Bug (A) | Fix (B) | Change |",
                "|---|---|---:|---:|---:|",
                *(
                    f"| {cell(r['site'])} | {_code(r['code'])} | {format_bytes(r['bytes_a'])} | {format_bytes(r['bytes_b'])} "
                    f"| {signed_bytes(r['growth'])} |"
                    for r in entry[way]
                ),
                "",
            ]
    changed = [h for h in entry.get("holders") or [] if h["growth"]]
    if changed:
        body += [
            "**By holder**, as the hunt named them on each side:",
            "",
            "| Holder | Bug (A) | Fix (B) | Change |",
            "|---|---:|---:|---:|",
            *(
                f"| {cell(h['holder'])} | {format_bytes(h['bytes_a'])} | {format_bytes(h['bytes_b'])} "  # its names are `code`
                f"| {signed_bytes(h['growth'])} |"
                for h in changed
            ),
            "",
        ]
    for name in entry.get("files") or []:
        body += [picture(page_uri, name, f"What the fix changed, by line: {name}"), ""]
    return [f'??? abstract "{COMPARE_FOLD}"', "", *indented("\n".join(body).rstrip("\n")), ""]


def _amount(figure: dict, value) -> str:
    if value is None:
        return ""
    return format_bytes(value) if figure["bytes"] else f"{value:,}"


def _change(figure: dict) -> str:
    change = figure["change"]
    if change is None:
        return ""
    return signed_bytes(change) if figure["bytes"] else f"{change:+,}"


def _code(code: str) -> str:
    """A line of source as inline code in a table cell (a backtick inside it would end the span, so then it is plain)."""
    if not code:
        return ""
    return cell(f"`{code}`") if "`" not in code else cell(escaped(code))
