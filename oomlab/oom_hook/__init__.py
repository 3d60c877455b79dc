"""An OOM hook for real training code: when the GPU runs out of memory, write down why, then fail as before.

One line in a training script::

    from oomlab.oom_hook import oom_report

    with oom_report("oom-reports"):   # or @oom_report("oom-reports") on the function that trains
        train()

or, for a script whose loop cannot be indented, ``oomlab.oom_hook.install("oom-reports")``
at its top (it wraps ``sys.excepthook`` and ``threading.excepthook``; :func:`uninstall`
takes it off again).

On ``torch.OutOfMemoryError`` (or any error raised from one) the hook writes a
folder ``oom-reports/<date>-<time>-pid<pid>/`` while the failed state is still
alive, then the error propagates unchanged, the same object with the same
traceback: the script fails exactly as it did without the hook. The folder
holds what the workflow's tools would have said at that moment, computed by
the same code (see :mod:`oomlab.oom_hook.report` for the layout):

- per device the process used, ``cuda<N>/snapshot.pickle`` (the allocator's
  snapshot; open it at https://pytorch.org/memory_viz or with ``oomlab snapshot``)
  and ``fragmentation.json``/``.txt`` (the snapshot tool's analysis);
- ``holders.json``/``.txt``: the objects that keep GPU memory alive (the hunt
  tool's walk from the exception's frames and the main module's globals);
- ``finding.json``/``.txt``: what to fix first (:func:`oomlab.steps.fix_first`);
- ``README.txt``, ``exception.txt``, and ``error.txt`` if part of the report failed.
  A failure inside the hook never replaces the OOM: it is described there.

Options of :func:`oom_report` and :func:`install`:

``record_history=True``
    Record every allocation with its Python stack from the moment the hook is
    entered, so the snapshot can name the line that allocated each block and
    the failed request's exact size. On by default because the OOM you need to
    explain happens once, often hours in: history must already be running
    then. It costs host time at each allocation and host memory for the ring
    buffer, no GPU memory (see "What it costs" below). Off, the report still
    has every segment and block, without their stacks. A history the script
    recorded already is used and left alone.
``max_entries=100_000``
    How many allocator events the history keeps (the last ones).
``stacks="python"``
    Python frames only, which is cheap; ``"all"`` adds C++ frames and costs many times more.
``devices=None``
    Which CUDA devices to report; by default every device the allocator used.
``watch_steps=True``
    After every ``optimizer.step()`` note the allocated memory, and after the
    first one what each name held, so that the holders can tell a list that
    grows every step from one that was always this big (the hunt tool's baseline).
``script=None``
    The training script whose frames and globals the holders are named by;
    by default the main module's file.

What it costs is measured, not assumed: ``oomlab dev bench --oom-hook STEPS`` (or
``python -m oomlab.bench.oom_hook`` alone) times a real training loop plain and inside the
hook, history off and on, and keeps the figures in ``course/measurements/speed.json``.
History recording costs host time at each allocation, so it shows in the step time
where the host sets the pace (short steps, many allocations) and hides behind the
GPU's work where the GPU does; the holders' baseline walk costs the first step once,
and the report itself is written only at the OOM.

Recording history initialises CUDA when the hook is entered, if the script has
not yet. A bad option is one :class:`oomlab.errors.OomLabError` when the hook is
made or entered, never at the OOM. The reported exception gets one attribute,
``oomlab_report``: the report's folder. In a process with several GPUs each
device gets its own folder; with one process per GPU (torchrun) each process
writes its own report, and ``oomlab diagnose FOLDER`` (:mod:`oomlab.oom_hook.reports`)
sets every rank's report side by side.
"""

from oomlab.oom_hook.hook import DEFAULT_FOLDER, DEFAULT_MAX_ENTRIES, OomReport, install, oom_report, uninstall

__all__ = ["DEFAULT_FOLDER", "DEFAULT_MAX_ENTRIES", "OomReport", "install", "oom_report", "uninstall"]
