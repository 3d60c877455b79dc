"""``oomlab nbgrader student-wheel DIR``: oomlab as students may have it, packaged as a wheel.

The full wheel (``pip install oomlab``) carries the whole course under ``oomlab/_course/``:
the reference fixes in ``solutions/``, and in every ``exercise.toml`` the interview's
model answer and the accepted alternative fixes (``[[alternatives]]``: edits of the buggy
script that pass). A student who installs it to run the notebooks can read them all.

The student build is the same package with a smaller course:

- each exercise's script (an estimate exercise's estimator) as shipped, and its manifest
  without ``[[alternatives]]`` and with the model answer replaced by :data:`ANSWER_KEPT`. The
  manifest is written again from its data (:mod:`oomlab.classroom.tomltext`; its comments go)
  and loaded with :func:`~oomlab.course.manifest.load_exercise` before the wheel is written,
  so it loads as any other. The wrong fixes stay: the loader requires them, and each is a fix that fails;
- the list of modules (``exercises/modules.toml``) as shipped: it orders the course;
- the graders, so that ``oomlab init`` works;
- no ``solutions/``: neither the reference fixes nor the reference estimators.

Installed, the notebooks' measuring cell still runs a script under its budget and shows
its figures, and every cell says that the grade comes from the instructor
(:mod:`oomlab.classroom.cells`): grading compares with the reference fixes, on the
instructor's machine, against the class's pinned copy. The wheel's version carries
``+student``, so that it is never taken for the full one.
"""

from __future__ import annotations

import importlib.metadata
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

import oomlab
from oomlab import __version__
from oomlab.classroom import tomltext
from oomlab.classroom.wheel import write_wheel
from oomlab.course.manifest import load_exercise
from oomlab.course.modules import MODULE_LIST, load_list
from oomlab.course.shipped import shipped_root
from oomlab.course.state import read_error, shown, write_error
from oomlab.errors import OomLabError

__all__ = ["ANSWER_KEPT", "LOCAL", "build_student_wheel", "student_course", "student_manifest"]

NAME = "oomlab"
LOCAL = "student"  # the version's local label: 0.2.0+student
MANIFEST = "exercise.toml"
ANSWER_KEPT = "The model answer is kept by your instructor: this is the student build of the course."
GRADERS = "graders"
SKIPPED = ("__pycache__", ".pytest_cache")


def student_manifest(text: str) -> str:
    """A manifest's text as the student build has it: no ``[[alternatives]]``, the model answer replaced."""
    data = tomllib.loads(text)
    data.pop("alternatives", None)
    if isinstance(data.get("interview"), dict) and "answer" in data["interview"]:
        data["interview"]["answer"] = ANSWER_KEPT
    return tomltext.dumps(data)


def student_course(shipped: Path) -> dict[str, bytes]:
    """The student build's course, by path under ``_course/``: the list of modules, exercises (script and manifest) and graders."""
    files: dict[str, bytes] = {f"exercises/{MODULE_LIST}": _read_bytes(shipped / "exercises" / MODULE_LIST)}  # as shipped
    _, drafts = load_list(shipped / "exercises" / MODULE_LIST)  # not the students': no GPU has measured them
    for folder in sorted((shipped / "exercises").iterdir()):
        if not folder.is_dir() or folder.name.startswith((".", "_")) or folder.name in drafts:  # as the course reads them
            continue
        ex = load_exercise(folder / MANIFEST, shipped, shipped / "solutions")  # the original loads, or says what is wrong
        files[f"exercises/{ex.id}/{MANIFEST}"] = student_manifest(_read_bytes(folder / MANIFEST).decode("utf-8")).encode()
        files[f"exercises/{ex.id}/{ex.file}"] = _read_bytes(folder / ex.file)
    for path in sorted((shipped / GRADERS).rglob("*")):
        if path.is_file() and not any(part in SKIPPED for part in path.parts) and path.suffix != ".pyc":
            files[f"{GRADERS}/{path.relative_to(shipped / GRADERS).as_posix()}"] = _read_bytes(path)
    _check_loads(files)
    return files


def _check_loads(course: dict[str, bytes]) -> None:
    """Load every manifest of ``course`` as oomlab will: a student build that does not load is never written."""
    with tempfile.TemporaryDirectory(prefix="oomlab-student-") as tmp:
        root = Path(tmp)
        for rel, data in course.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        for manifest in sorted(root.glob(f"exercises/*/{MANIFEST}")):
            ex = load_exercise(manifest, root, root / "solutions")
            if ex.alternatives or ex.interview.answer != ANSWER_KEPT:
                raise OomLabError(f"The student manifest of {ex.id} still holds answers.", "Report this as a bug in oomlab.")


def package_files(package: Path | None = None) -> dict[str, bytes]:
    """The ``oomlab`` package's modules, as setuptools finds them: ``.py`` files of folders with an ``__init__.py``.

    A folder that is no package is not entered: so neither a wheel's ``_course/`` nor ``__pycache__/``.
    """
    files: dict[str, bytes] = {}

    def walk(folder: Path, prefix: str) -> None:
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                walk(path, f"{prefix}{path.name}/")
            elif path.is_file() and path.suffix == ".py":
                files[f"{prefix}{path.name}"] = _read_bytes(path)

    walk(package or Path(oomlab.__file__).resolve().parent, f"{NAME}/")
    return files


def _metadata(version: str) -> tuple[str, str]:
    """``METADATA`` and ``entry_points.txt`` of the student build: the installed package's, with its version and summary."""
    try:
        dist = importlib.metadata.distribution(NAME)
    except importlib.metadata.PackageNotFoundError:
        raise OomLabError(
            "oomlab's package metadata is not installed here, so the wheel would not know its requirements.",
            "Install oomlab (pip install oomlab, or pip install -e . in a checkout) and run this again.",
        ) from None
    lines = []
    for key, value in dist.metadata.items():
        if key in ("Version", "Description", "Description-Content-Type", "License-File"):
            continue
        value = " ".join(str(value).split())  # one line each, however the original was folded
        if key == "Summary":
            value += " The student build: no reference fixes, no model answers."
        lines.append(f"{key}: {value}")
        if key == "Name":
            lines.append(f"Version: {version}")
    body = (
        "The student build of OOM Lab, for the learners' notebook kernels: the exercises, the tools and the notebooks' "
        "cells, without the reference fixes, the interview's model answers or the accepted alternative fixes. "
        "It measures a notebook's script but does not grade it: the instructor does.\n"
    )
    groups: dict[str, list[str]] = {}
    for ep in dist.entry_points:
        groups.setdefault(ep.group, []).append(f"{ep.name} = {ep.value}")
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{line}\n" for line in sorted(eps)) + "\n" for group, eps in sorted(groups.items())
    )
    return "\n".join(lines) + "\n\n" + body, entry_points


def build_student_wheel(folder: Path) -> Path:
    """Write the student build's wheel into ``folder``; see the module's docstring. Returns its path."""
    shipped = shipped_root()
    if shipped is None:
        raise OomLabError("This installation of oomlab carries no course.", "Reinstall it: pip install oomlab")
    if not (shipped / "solutions").is_dir():
        raise OomLabError(
            "This installation of oomlab is a student build already.",
            "Build the student wheel where the full oomlab is installed.",
        )
    version = f"{__version__}+{LOCAL}"
    files = package_files()
    files |= {f"{NAME}/_course/{rel}": data for rel, data in student_course(shipped).items()}
    metadata, entry_points = _metadata(version)
    folder = Path(folder).expanduser()
    try:
        return write_wheel(folder, NAME, version, files, metadata, entry_points)
    except OSError as err:
        raise write_error(folder, err, "write the student wheel into") from None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise read_error(path, err, "a file of the course", name=shown(path)) from None
