"""Step 3 of the workflow: profile the run and name the operator and line at its memory peak.

The probe wraps the learner's script in ``torch.profiler.profile`` with memory,
shapes and Python stacks recorded, and writes ``profile.json``:

- the operators that allocated the most memory;
- the memory timeline of the profiled device, by category (parameters,
  gradients, optimizer state, activations, temporaries, ...): the profiler's
  memory model names what it can; on CUDA it leaves most forward-pass tensors
  unnamed (seen with torch 2.11 on an H200), so those are named by when they
  lived (see :func:`~oomlab.tools.profile.analysis.lifetime_category`);
- the peak: when it happened, how many bytes of each category were live, the
  operator whose allocation made it, the learner's line that called it, and
  the bytes live at that moment grouped by the line that allocated them (the
  culprit is the peak's own line unless another line holds far more);
- when the run failed in a profiled step, the ``failure``: when (``time_ms``),
  the bytes live at the last allocation that succeeded (``live_bytes``) and
  those the failed one asked for (``request_bytes``, None when the error did
  not say). The headline says them in words; whoever needs the figures reads
  them here, not out of the headline.

A peak made of bytes that are freed again before the optimizer step ends is a
``"transient-peak"`` (a temporary too large: fix the line); a peak that stays
is ``"steady"`` (the model, its state or something kept alive is too large).
When the run fails (an OOM), the peak is the highest point of the step that
failed, which never ended; tensors that earlier forward passes of that step
left alive (a cache, graphs kept in a list) then mark it ``"steady"``.

The memory model (``torch.profiler._memory_profiler``) and the profiler's event
tree are private APIs. Each is used behind a guard: when one is missing or
fails, the JSON says so and the analysis falls back to what is left (the
categories by lifetime alone, then the operator table alone).

The modules, as for every tool (see :mod:`oomlab.tools.base`):

- :mod:`~oomlab.tools.profile.probe` runs inside the measured process: it
  starts and stops the profiler and puts the result together;
- :mod:`~oomlab.tools.profile.events` reads the live profiler: its event tree
  (allocations, operators, Python calls and the lines they come from) and its
  operator table;
- :mod:`~oomlab.tools.profile.categories` names the category of every
  allocation, by the memory model or by the tensor's lifetime;
- :mod:`~oomlab.tools.profile.analysis`: the timeline, the peak, its kind and
  the headline, pure functions over plain data with no torch;
- :mod:`~oomlab.tools.profile.present`: the tables in the terminal and
  ``profile.png``, from the JSON alone.

Nothing is imported here: the measuring child imports the probe through this
package and must stay close to a plain ``python train.py``.
"""
