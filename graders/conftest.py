"""The graders' pytest options: ``--solutions`` checks the course itself; GPU tests skip without a GPU."""

from oomlab.grading.pytest_plugin import (  # noqa: F401
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
