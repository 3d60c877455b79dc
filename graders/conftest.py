"""The graders' pytest options: ``--solutions`` checks the course itself; GPU tests skip without a GPU."""

from oomlab.grading.pytest_plugin import pytest_addoption, pytest_collection_modifyitems, pytest_configure  # noqa: F401
