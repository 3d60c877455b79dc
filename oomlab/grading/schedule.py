"""Run many measurements ``jobs`` at a time, the longest first, each as soon as what it needs is done.

The truth check is hundreds of runs of 1 to 50 seconds on one GPU. Run in course
order, with every reference fix measured before any variant starts, a sitting
ends with a few long runs going alone while the other slots idle. Three rules keep
it near its floor, ``max(longest run, sum of runs / jobs)``:

- a task waits only for the task it needs (an exercise's variants for its own
  reference fix), never for a whole phase;
- among the tasks that can start, the one expected to take longest starts first
  (the classic longest-processing-time rule), with expectations read from the
  last committed report;
- a task expected to keep several CPU cores busy (a cheat that moves the model's
  work to the CPU keeps three or four) starts only while the cores the running
  tasks are expected to use leave room for it: started together, such runs take
  each other's cores and every one of them runs twice as long. The tasks ranked
  behind it wait with it rather than take those cores, or the longest such run
  (113 s on the H200) would be passed over until it ran alone at the end.

The cores set a floor of their own besides: the runs' CPU seconds over the cores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

__all__ = ["Task", "run_longest_first"]


@dataclass
class Task:
    key: Hashable
    run: Callable[[dict], object]  # given the results so far (its prerequisite's among them), returns its own
    seconds: float = 0.0  # how long it is expected to take: longer starts sooner
    after: Hashable | None = None  # the key of the task whose result it needs
    first: bool = False  # start before every task that is not: it unblocks others
    cores: float = 1.0  # the CPU cores it is expected to keep busy
    _order: int = field(default=0, repr=False)

    def rank(self) -> tuple:
        return (not self.first, -self.seconds, self._order)


def run_longest_first(tasks: Iterable[Task], jobs: int, cores: float | None = None) -> dict:
    """Run the tasks on ``jobs`` threads, their expected ``cores`` within ``cores`` (no limit: None); their results by
    key. A task that needs more cores than there are runs alone. The first exception stops new starts and is raised."""
    tasks = list(tasks)
    for i, task in enumerate(tasks):
        task._order = i
    keys = {t.key for t in tasks}
    if len(keys) != len(tasks):
        raise ValueError("every task needs its own key")
    missing = [t.key for t in tasks if t.after is not None and t.after not in keys]
    if missing:
        raise ValueError(f"tasks wait for keys no task has: {missing[:3]}")
    waiting: dict[Hashable, list[Task]] = {}
    ready: list[Task] = []
    for task in tasks:
        if task.after is None:
            ready.append(task)
        else:
            waiting.setdefault(task.after, []).append(task)
    results: dict = {}
    errors: list[BaseException] = []
    remaining = [len(tasks)]
    busy = [0.0, 0]  # the cores the running tasks are expected to use, and how many are running
    lock = threading.Condition()

    def next_that_fits() -> Task | None:
        """The first task in rank order, once its cores fit beside the running ones (at once, when none runs).

        The tasks behind it wait too: let them take the cores it waits for, and a long run that needs several
        cores is passed over again and again until it starts last and runs alone at the end.
        """
        if not ready:
            return None
        task = min(ready, key=Task.rank)
        if cores is not None and busy[1] and busy[0] + task.cores > cores:
            return None
        ready.remove(task)
        return task

    def worker() -> None:
        while True:
            with lock:
                while remaining[0] and not errors and (task := next_that_fits()) is None:
                    lock.wait()
                if errors or not remaining[0]:
                    lock.notify_all()
                    return
                busy[0] += task.cores
                busy[1] += 1
            try:
                result = task.run(results)
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread below
                with lock:
                    errors.append(err)
                    lock.notify_all()
                return
            with lock:
                busy[0] -= task.cores
                busy[1] -= 1
                results[task.key] = result
                remaining[0] -= 1
                ready.extend(waiting.pop(task.key, []))
                lock.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(jobs, len(tasks))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
