"""TOML written from data: the shapes an ``exercise.toml`` holds, and proof that it reads back the same.

The standard library reads TOML (``tomllib``) and does not write it. A student build
(:mod:`oomlab.classroom.student`) writes each manifest again from its data, less what
stays with the instructor. :func:`dumps` writes strings, integers, floats, booleans,
arrays, tables and arrays of tables; comments and layout are not data, so they are
not kept. It reads its own text back and raises where that is not the data it was given.
"""

from __future__ import annotations

import json
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["dumps"]

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
WIDTH = 120  # an array longer than this on one line is written one item a line


def dumps(data: dict) -> str:
    """``data`` as TOML text: scalars and inline arrays first in each table, then its tables, then its arrays of tables."""
    lines: list[str] = []
    _table(data, [], lines)
    text = "\n".join(lines).strip("\n") + "\n"
    try:
        same = tomllib.loads(text) == data
    except tomllib.TOMLDecodeError:
        same = False
    if not same:
        raise ValueError("the TOML written does not read back as the data it was written from")
    return text


def _is_tables(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _table(table: dict, path: list[str], lines: list[str]) -> None:
    for key, value in table.items():
        if not isinstance(value, dict) and not _is_tables(value):
            line = f"{_key(key)} = {_value(value)}"
            if isinstance(value, list) and len(line) > WIDTH:  # a long array, one item a line
                line = f"{_key(key)} = [\n" + "".join(f"    {_value(item)},\n" for item in value) + "]"
            lines.append(line)
    for key, value in table.items():
        name = ".".join(_key(k) for k in [*path, key])
        if isinstance(value, dict):
            lines += ["", f"[{name}]"]
            _table(value, [*path, key], lines)
        elif _is_tables(value):
            for item in value:  # each [[name]] opens the next element; the tables under it belong to that element
                lines += ["", f"[[{name}]]"]
                _table(item, [*path, key], lines)


def _key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else _basic(key)


def _value(value) -> str:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # 0.5, 1e-06, inf, nan: all TOML as Python writes them
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write a {type(value).__name__} as TOML")


def _string(text: str) -> str:
    """A multi-line literal string where it can be one (code and prose stay readable), else a basic string."""
    plain = all(c in "\n\t" or (c >= " " and c != "\x7f") for c in text)
    if "\n" in text and plain and "'''" not in text and not text.endswith("'"):
        return "'''\n" + text + "'''"  # the newline after the opening quotes is not part of the string
    return _basic(text)


def _basic(text: str) -> str:
    # JSON's escapes are TOML's, but for DEL, which TOML wants escaped and JSON leaves as it is
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
