"""The two Markdown helpers every generated page needs: a relative link, and text safe in a table cell."""

from __future__ import annotations

__all__ = ["cell", "link_from"]


def link_from(page_src_uri: str, target: str) -> str:
    """A relative link from one docs page's source path to another (both relative to the docs folder)."""
    return "../" * page_src_uri.count("/") + target


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
