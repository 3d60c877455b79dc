"""The course site: :mod:`~oomlab.site.hooks` (named in ``mkdocs.yml``) generates the exercise and
measurement pages from the manifests and ``verify.json``; :mod:`~oomlab.site.figures` draws the
pictures in ``course/figures/`` with the tools themselves (``oomlab dev figures``).
"""
