"""Puts the course into the wheel: a pip-installed oomlab carries its exercises, solutions and graders.

``oomlab init`` copies them from ``oomlab/_course/`` into a folder to work in.
An editable install needs no copy: it finds the course beside the package.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

COURSE = ("exercises", "solutions", "graders")
# Two allocator snapshots taken on a real GPU, the seeded bug's and the fix's of one exercise, so that a course
# installed on a machine without a GPU still has snapshots for `oomlab snapshot` and `oomlab compare` to read.
SNAPSHOTS = ("feature-cache-bug-snapshot.pickle", "feature-cache-fix-snapshot.pickle")


class BuildWithCourse(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        here = Path(__file__).resolve().parent
        target = Path(self.build_lib) / "oomlab" / "_course"
        for folder in COURSE:
            shutil.copytree(
                here / folder,
                target / folder,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"),
            )
        (target / "snapshots").mkdir(exist_ok=True)
        for name in SNAPSHOTS:
            shutil.copyfile(here / "course" / "figures" / name, target / "snapshots" / name)


setup(cmdclass={"build_py": BuildWithCourse})
