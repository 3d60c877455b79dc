"""OOM Lab: a graded course on PyTorch GPU out-of-memory errors, and the tools it teaches.

The package, by role (each subpackage's docstring says more)::

    oomlab/
      course/       the course folder: manifests, progress, originals and reset, init, .oomlab/ state
      measure/      one fresh process per run under a budget: harness, child, statistics, the machine
      grading/      checks, the reference cache, the verdict, and the one truth check over the course
      sizing/       a training step's bytes from its config: the decoder sized, measured, and estimators graded
      tools/        the workflow's tools, one package each (probe, analysis, presentation) on one base
      cli/          the ``oomlab`` command: the learner's loop, the tools, ``oomlab dev`` for maintainers
      site/         the mkdocs hooks that build the exercise pages, and the site's pictures
      steps.py      the registry of the workflow's steps and what their findings mean
      oom.py        what an OOM message says; frames.py: whose code a frame is; units.py: sizes
      production.py allocator metrics for long-lived workers (Prometheus) and when to recycle one
      oom_hook/     a one-line hook for training scripts: snapshot, holders and finding written at an OOM
"""

__version__ = "0.2.0"
