"""``oomlab compare A B``: two snapshots or two runs side by side, and what grew, by line and by holder.

A bug beside its fix, yesterday's run beside today's: the figures of each
(allocated, reserved, non-releasable, segments, peaks), then the live bytes by
allocation site in B minus A, the sites matched across different code by
their line text (the rule is in :mod:`~oomlab.tools.compare.analysis`), and,
where both sides were hunted, the same by holder.

Not a step of the workflow and not a probe: it reads what the snapshot and
hunt tools write, or runs them first.

- :mod:`~oomlab.tools.compare.sides`: what each argument is (a snapshot file,
  a tool's result, a folder, an exercise or a script) and the side it gives;
- :mod:`~oomlab.tools.compare.analysis`: the pairing and the result, pure over plain data;
- :mod:`~oomlab.tools.compare.present`: the tables in the terminal and ``compare.png``.
"""

DEFAULT_TOP = 10  # how many allocation sites (and holders) the comparison lists each way
