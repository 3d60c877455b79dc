"""Puts the course into the wheel: a pip-installed oomlab carries its exercises, solutions and graders.

``oomlab init`` copies them from ``oomlab/_course/`` into a folder to work in.
An editable install needs no copy: it finds the course beside the package.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

COURSE = ("exercises", "solutions", "graders")


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


setup(cmdclass={"build_py": BuildWithCourse})
