"""The Markdown helpers every generated page needs: its front matter, a relative link, a picture, plain text escaped, a table cell, a fold's body."""

from __future__ import annotations

import re

__all__ = ["FRONT_MATTER", "cell", "escaped", "indented", "link_from", "picture"]

# Wide tables need the room: the generated pages go without the right-hand table of contents.
FRONT_MATTER = "---\nhide:\n  - toc\n---\n\n"

_SPECIAL = re.compile(r"([\\`*_\[\]])")


def link_from(page_src_uri: str, target: str) -> str:
    """A relative link from one docs page's source path to another (both relative to the docs folder)."""
    return "../" * page_src_uri.count("/") + target


def picture(page_src_uri: str, name: str, alt: str) -> str:
    """A picture from course/figures/ that opens full size when clicked.

    The pictures are drawn for a wide screen: in the page's column their labels are
    small, so each is also a link to itself, where the browser shows it at full size.
    """
    target = link_from(page_src_uri, "figures/" + name)
    return f'[![{" ".join(alt.split())}]({target})]({target} "Open the picture full size")'


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def indented(markdown: str) -> list[str]:
    """Markdown as the lines of a fold's body (indented by four spaces; blank lines stay blank)."""
    return ["    " + line if line else "" for line in markdown.split("\n")]


def escaped(text: str) -> str:
    """Plain text that Markdown shows as it is: its emphasis, code and link characters escaped, ``<`` as an entity."""
    return _SPECIAL.sub(r"\\\1", text).replace("<", "&lt;")
