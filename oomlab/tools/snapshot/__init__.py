"""Step 1 of the workflow: the caching allocator's snapshot, read for fragmentation.

The probe records the allocator's history while the script runs, and at the
end (inside the ``except`` block when the script raised, so the failed state is
still alive) takes :func:`torch.cuda.memory._snapshot`, dumps it next to its
JSON for PyTorch's own viewer, and explains it:

- how much of the reserved memory is live, free, and free but *stranded*
  (inside a segment that a live block keeps from being released);
- which live blocks pin which segments, and where in the learner's script they
  were allocated;
- whether the failed request could have fitted in any free block;
- allocated and reserved bytes over the recorded history.

Snapshot format (see ``torch.cuda.memory._snapshot``)::

    {"segments": [{"address", "total_size", "stream", "segment_type": "small" | "large",
                   "allocated_size", "active_size", "is_expandable",
                   "blocks": [{"address", "size", "requested_size",
                               "state": "active_allocated" | "active_pending_free" | "inactive",
                               "frames": [{"filename", "line", "name"}, ...]}]}],
     "device_traces": [[{"action", "addr" (or "device_free" for "oom"), "size", "stream",
                         "frames", "time_us" (newer torch)}, ...] per device]}

Frames are listed innermost first. The dumped ``snapshot.pickle`` names files
without this machine's paths (``exercises/ID/train.py``, ``torch/nn/...``) so it
can be shared and committed; the analysis itself reads the absolute paths.

The modules, as for every tool (see :mod:`oomlab.tools.base`):

- :mod:`~oomlab.tools.snapshot.probe` runs inside the measured process;
- :mod:`~oomlab.tools.snapshot.analysis` reads and explains a snapshot, with no torch and no GPU;
- :mod:`~oomlab.tools.snapshot.present` shows the result in the terminal and draws it.

Nothing is imported here: the measuring child imports the probe through this
package and must stay close to a plain ``python train.py``.
"""
