"""Step 2 of the workflow: find the device memory that outlives a step, and name what holds it.

Memory that survives from one training step to the next is almost always held
by a Python name: a list that keeps every batch's loss (and, through the
loss's autograd graph, every activation that forward pass saved), a forward
hook that appends outputs to a closure's list, an exception kept for later
whose traceback keeps a failed batch's frame alive, or objects in a
reference cycle that only the garbage collector can free.

The hunt walks the references from named starting points ("roots": the
script's globals, the locals of its frames) and attributes every device tensor
storage it finds to one root, counting each storage once. The walk follows
autograd graphs too, so a scalar loss kept in a list is charged with the
activations its graph saved. It never calls user code on purpose: it reads
``__dict__`` and slots directly, skips modules, classes (except the script's
own) and functions' globals, and bounds itself by depth and node count.

The modules, as for every tool (see :mod:`oomlab.tools.base`):

- :mod:`~oomlab.tools.hunt.roots`: where the walk starts, and how each root is
  named: the script's frames and globals, torch's global hooks, a kept exception;
- :mod:`~oomlab.tools.hunt.state`: which tensors are model and optimizer state
  (parameters, gradients, buffers, moments), counted but never blamed;
- :mod:`~oomlab.tools.hunt.walk`: the reference walk, pure Python over any
  objects and device-agnostic, so the tests walk CPU tensors;
- :mod:`~oomlab.tools.hunt.holders`: ``find_holders``, the walk's passes in
  order (walk, cycles, back search, graph in flight) and one row per holder;
- :mod:`~oomlab.tools.hunt.backsearch`: from every device tensor the walk did
  not reach, back through whatever refers to it (a C cache such as
  ``functools.lru_cache``, a library's registry) to something a person can
  name; what stays unexplained is said with its size;
- :mod:`~oomlab.tools.hunt.inflight`: the graph of the forward or backward pass
  that was running at the OOM, the step's own, reported apart and never blamed;
- :mod:`~oomlab.tools.hunt.paths`: the one notation every path is written in;
- :mod:`~oomlab.tools.hunt.analysis`: the verdict (which holder outlives its
  step, and why), pure over the walk's plain-data holders;
- :mod:`~oomlab.tools.hunt.probe`: runs inside the measured process; an
  optimizer step hook records ``memory_allocated()`` after every step and what
  each root held after step 1 (the baseline), and the walk when the script
  stopped gives ``hunt.json``;
- :mod:`~oomlab.tools.hunt.present`: the table in the terminal and ``hunt.png``.

Nothing is imported here: the measuring child imports the probe through this
package and must stay close to a plain ``python train.py``.
"""
