"""A course's TOML file read into a dict, every way it can fail one clear :class:`OomLabError`."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from oomlab.errors import OomLabError

__all__ = ["read_toml"]


def read_toml(path: Path, if_missing: str) -> dict:
    """The table in ``path``; ``if_missing`` is what to do when it does not exist (what the file is for)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OomLabError(f"{path} does not exist.", if_missing) from None
    except tomllib.TOMLDecodeError as err:
        raise OomLabError(f"{path} is not valid TOML: {err}.", "Fix the syntax at the place named.") from None
    except UnicodeDecodeError as err:
        raise OomLabError(f"{path} is not UTF-8 text: {err.reason} at byte {err.start}.", "Save it as UTF-8.") from None
    except OSError as err:
        raise OomLabError(f"Cannot read {path}: {err.strerror or err}.", "Make it a readable file.") from None
