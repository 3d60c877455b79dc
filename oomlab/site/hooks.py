"""MkDocs hooks: the course site's wiring, named under ``hooks:`` in ``mkdocs.yml``.

Only the wiring is here; each page, and each thing put into a page, has a module of its own.
Nothing is written to disk: the generated pages are files of the build alone.

- ``on_config`` reads the exercises and the committed reports once, into one
  :class:`~oomlab.site.reports.Reports` that every page is made from, and fills the ``Exercises``
  section of the nav, module by module, in course order;
- ``on_files`` adds the generated pages: one per exercise, ``exercises/<id>.md``
  (:mod:`oomlab.site.exercise_page`, the reference solution never shown but folded); one per
  module, ``modules/NAME.md`` (:mod:`oomlab.site.module_pages`); ``measurements.md``, every figure
  the course measured (:mod:`oomlab.site.measurements_page`); and ``cli.md``, the command
  reference, from the CLI itself (:mod:`oomlab.site.cli_reference`);
- ``on_page_markdown`` replaces the ``<!-- oomlab:... -->`` markers of every page with what the
  course measured or drew (:mod:`oomlab.site.markers` lists them).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # mkdocs loads this file by path, not as oomlab.site.hooks
    sys.path.insert(0, str(_ROOT))

from oomlab.site import markers, reports  # noqa: E402
from oomlab.site.cli_reference import cli_reference  # noqa: E402
from oomlab.site.exercise_page import exercise_page  # noqa: E402
from oomlab.site.markdown import FRONT_MATTER  # noqa: E402
from oomlab.site.measurements_page import measurements_page  # noqa: E402
from oomlab.site.module_pages import module_page, module_uri, page_uri, taught  # noqa: E402

CLI_PAGE = "cli.md"  # the command reference, generated from the CLI itself
MEASUREMENTS_PAGE = "measurements.md"

# What this build reads, set by on_config. The one value the hooks keep between calls: mkdocs calls
# them as plain functions, and `mkdocs serve` calls on_config again for each rebuild, so each build
# reads the reports afresh.
_reports: reports.Reports | None = None


def on_config(config):
    global _reports
    _reports = reports.load(Path(config.config_file_path).resolve().parent, Path(config.docs_dir))
    entries = [
        {module.title: [{"About this module": module_uri(module)}, *({ex.title: page_uri(ex)} for _, ex in chosen)]}
        for module, chosen in taught(_reports.exercises)
    ]
    nav = config.nav
    if nav is not None:
        slot = next((item for item in nav if isinstance(item, dict) and "Exercises" in item), None)
        if slot is None:
            nav.append({"Exercises": entries})
        elif not slot["Exercises"]:
            slot["Exercises"] = entries
    return config


def on_files(files, config):
    exercises = _reports.exercises
    modules = [m for m, _ in taught(exercises)]
    for uri in [*(page_uri(ex) for ex in exercises), *map(module_uri, modules), MEASUREMENTS_PAGE, CLI_PAGE]:
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"course/{uri} exists, but the site generates that page: remove the file.")
    for number, ex in enumerate(exercises, 1):
        files.append(File.generated(config, page_uri(ex), content=exercise_page(ex, number, len(exercises), _reports)))
    for module in modules:
        files.append(File.generated(config, module_uri(module), content=module_page(module, exercises, Path(config.docs_dir))))
    files.append(File.generated(config, MEASUREMENTS_PAGE, content=measurements_page(_reports)))
    files.append(File.generated(config, CLI_PAGE, content=FRONT_MATTER + cli_reference()))
    return files


def on_page_markdown(markdown, page, config, files):
    return markers.render(markdown, page.file.src_uri, _reports)
