"""A pure-Python wheel written from its files: the zip, its ``.dist-info`` and the ``RECORD`` that pip checks.

A wheel (PEP 427) is a zip of the files to install, plus a ``NAME-VERSION.dist-info/``
folder: ``METADATA`` (the package's name, version and requirements), ``WHEEL`` (the
wheel's own format and tags), ``entry_points.txt`` (the commands it installs) and
``RECORD``, every file with its SHA-256 and size, which pip checks on install. For
pure Python that is all there is, so :func:`write_wheel` needs no build backend.

The same files give the same wheel, byte for byte: the entries are sorted, the
``.dist-info`` last, as the format recommends, and every entry has the same date.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

__all__ = ["write_wheel"]

TAG = "py3-none-any"
DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: a fixed date, so the same files make the same bytes


def write_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], metadata: str, entry_points: str = "") -> Path:
    """Write ``NAME-VERSION-py3-none-any.whl`` into ``folder`` and return its path.

    ``files`` maps paths in the wheel (``oomlab/__init__.py``) to their bytes;
    ``metadata`` is the ``METADATA`` text, and ``entry_points`` that of ``entry_points.txt``.
    The wheel is written beside its final name and renamed there, so a wheel found there is whole.
    """
    info = f"{name}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: oomlab\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode(),
    }
    if entry_points:
        meta[f"{info}/entry_points.txt"] = entry_points.encode()
    entries = dict(sorted(files.items())) | meta
    record = "".join(f"{path},sha256={_digest(data)},{len(data)}\n" for path, data in entries.items())
    entries[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{TAG}.whl"
    partial = path.with_name(path.name + ".partial")
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            for entry, data in entries.items():
                member = zipfile.ZipInfo(entry, DATE)
                member.external_attr = 0o644 << 16  # -rw-r--r--
                member.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(member, data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _digest(data: bytes) -> str:
    """RECORD's form of a hash: SHA-256, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
