"""One rank of a measured torchrun job; torch's launcher starts this file once per rank.

Usage: ``python -m torch.distributed.run --standalone --nproc-per-node N rank_child.py FOLDER``,
started by :mod:`oomlab.measure.ranks`, which wrote ``FOLDER/rank<R>/spec.json`` for every rank.
This process is rank ``RANK`` (the launcher sets it, with ``LOCAL_RANK`` and ``WORLD_SIZE``); before
it becomes the measuring child (:func:`oomlab.measure.child.main`) of its rank's spec, it:

- writes its pid to ``rank<R>/pid``: the watcher matches the driver's per-process figures by it,
  and signals this rank by it;
- sends its output to ``rank<R>/stdout.txt`` and ``stderr.txt``, where the launcher would have
  interleaved every rank's lines in one stream;
- arms :mod:`faulthandler` on ``SIGUSR1``: a rank still running after another failed is usually
  waiting in a collective for it, and the watcher asks it where, thread by thread, into
  ``rank<R>/stacks.txt``; a ``SIGINT`` then ends the wait where Python can, so the rank's probe
  still reports;
- makes the rank's GPU the current device when there are at least as many GPUs as ranks
  (``LOCAL_RANK``), so that the budget, and the figures read at the end, are those of the GPU this
  rank uses. With fewer GPUs every rank shares the first, each under its own budget;
- counts the collectives the script calls through ``torch.distributed`` (:data:`COLLECTIVES`),
  by name, and every collective the rank issued on the default process group, torch's own
  included (DDP's reducer and FSDP's hooks call the group from C++, where no Python wrapper sees
  them: the group's own sequence number counts them), into ``rank<R>/collectives.json`` when the
  rank ends: ranks that made different calls no longer pair their collectives up, which is how
  an OOM caught and skipped on one rank hangs or corrupts the others.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import signal
import sys

if __name__ == "__main__":  # run as a file: make the oomlab package importable
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oomlab.measure import child, collectives  # noqa: E402 - after the path above

ASK_STACKS = signal.SIGUSR1
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
)


def rank_folder(folder: str) -> str:
    return os.path.join(folder, f"rank{int(os.environ.get('RANK', '0'))}")


def redirect_output(mine: str) -> None:
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        out = os.open(os.path.join(mine, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)


def use_the_ranks_gpu(spec: dict) -> None:
    if not spec.get("require_cuda"):
        return
    try:
        import torch

        local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if count > 1 and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= count:
            torch.cuda.set_device(local)
    except Exception:  # noqa: BLE001 - the measuring child says what is wrong with torch or CUDA
        pass


def count_collectives(counts: dict) -> None:
    """Wrap :data:`COLLECTIVES` in ``torch.distributed`` so that each call adds one to ``counts[name]``, even one that fails."""
    try:
        import torch.distributed as dist
    except ImportError:  # no torch: the measuring child says so
        return
    for name in COLLECTIVES:
        call = getattr(dist, name, None)
        if call is None:
            continue

        @functools.wraps(call)
        def counted(*args, _call=call, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _call(*args, **kwargs)

        setattr(dist, name, counted)


def main(folder: str) -> int:
    mine = rank_folder(folder)
    spec_path = os.path.join(mine, "spec.json")
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    redirect_output(mine)
    # The watcher's interrupt must reach the script: a job started in the background of a shell without job control
    # (`cmd &` in a script, nohup) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stacks = open(os.path.join(mine, "stacks.txt"), "w", encoding="utf-8")  # noqa: SIM115 - open as long as the process
    faulthandler.register(ASK_STACKS, file=stacks, all_threads=True)
    use_the_ranks_gpu(spec)
    counts: dict[str, int] = {}
    count_collectives(counts)
    kept: dict = {}
    collectives.keep_counting(kept)
    with open(os.path.join(mine, "pid"), "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))  # last: the watcher signals a rank only once it can answer
    try:
        return child.main(spec_path)
    finally:
        with open(os.path.join(mine, "collectives.json"), "w", encoding="utf-8") as f:
            json.dump({"calls": counts, "issued": collectives.at_end(kept)}, f)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
