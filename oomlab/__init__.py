"""OOM Lab: graders, measuring harness and learner CLI for the course.

The package is small on purpose; each module has one job:

- ``course``      finds the course folder and its exercises
- ``manifest``    reads and validates ``exercise.toml``
- ``harness``     measures a script in a fresh subprocess (``_child`` runs inside it)
- ``checks``      turns a measurement into named pass/fail checks
- ``reference``   measures and caches the reference solution per GPU and torch version
- ``grading``     puts the three together into one verdict
- ``verify``      the course's own truth check over every exercise
- ``progress``    the learner's state file
- ``cli``         the ``oomlab`` command
"""

__version__ = "0.1.0"
