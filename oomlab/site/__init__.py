"""The course site: :mod:`~oomlab.site.hooks` (named in ``mkdocs.yml``) wires into mkdocs the pages
generated from the manifests and the committed reports (:mod:`~oomlab.site.reports`), each page in a
module of its own (:mod:`~oomlab.site.exercise_page`, :mod:`~oomlab.site.measurements_page`,
:mod:`~oomlab.site.module_pages`); :mod:`~oomlab.site.figures` draws the pictures in
``course/figures/`` with the tools themselves (``oomlab dev figures``).
"""
