"""The truth check's scheduler: prerequisites first, then the longest run that can start."""

from __future__ import annotations

import threading
import time

import pytest

from oomlab.grading.schedule import Task, run_longest_first


def recorder():
    started: list = []
    lock = threading.Lock()

    def task(key, seconds=0.0, after=None, first=False, value=None):
        def run(done):
            with lock:
                started.append(key)
            if after is not None:
                assert after in done, f"{key} started before {after} was done"
            return value if value is not None else key

        return Task(key, run, seconds=seconds, after=after, first=first)

    return started, task


def test_one_slot_starts_prerequisites_first_then_the_longest_that_can_start():
    started, task = recorder()
    tasks = [
        task("a-ref", first=True, seconds=10),
        task("b-ref", first=True, seconds=50),
        task("a1", seconds=1, after="a-ref"),
        task("a2", seconds=30, after="a-ref"),
        task("b1", seconds=20, after="b-ref"),
        task("loose", seconds=25),
    ]
    done = run_longest_first(tasks, jobs=1)
    assert started == ["b-ref", "a-ref", "a2", "loose", "b1", "a1"]
    assert done == {key: key for key in started}


def test_many_slots_run_every_task_once_and_never_before_what_it_needs():
    started, task = recorder()
    tasks = [task(f"ref{i}", first=True, seconds=i) for i in range(5)]
    tasks += [task((i, j), seconds=j, after=f"ref{i}") for i in range(5) for j in range(20)]
    done = run_longest_first(tasks, jobs=4)
    assert sorted(map(str, started)) == sorted(str(t.key) for t in tasks)
    assert set(done) == {t.key for t in tasks}


def test_the_first_error_stops_new_starts_and_reaches_the_caller():
    started, task = recorder()

    def broken(done):
        raise RuntimeError("the reference fix did not run")

    tasks = [Task("ref", broken, first=True), task("after-ref", after="ref"), task("other", seconds=0)]
    with pytest.raises(RuntimeError, match="did not run"):
        run_longest_first(tasks, jobs=1)
    assert "after-ref" not in started and "other" not in started


def test_a_task_waiting_for_a_key_no_task_has_is_refused_before_anything_runs():
    started, task = recorder()
    with pytest.raises(ValueError, match="no task has"):
        run_longest_first([task("x"), task("y", after="nobody")], jobs=2)
    assert started == []


def test_a_task_that_keeps_several_cores_busy_waits_for_room_and_runs_alone_if_it_needs_them_all():
    running, most, lock = [0.0], [0.0], threading.Lock()

    def task(key, cores, seconds=1.0):
        def run(done):
            with lock:
                running[0] += cores
                most[0] = max(most[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= cores
            return key

        return Task(key, run, seconds=seconds, cores=cores)

    tasks = [task(f"heavy{i}", 4.0, seconds=10) for i in range(3)] + [task(f"light{i}", 1.0) for i in range(8)]
    tasks.append(task("huge", 20.0, seconds=5))
    done = run_longest_first(tasks, jobs=8, cores=6)
    assert len(done) == len(tasks)
    assert most[0] == 20.0, "a task that needs more cores than there are runs, alone"
    running[0] = most[0] = 0.0
    run_longest_first(tasks[:-1], jobs=8, cores=6)
    assert most[0] <= 6.0, "the running tasks' cores never exceed the machine's"


def test_a_long_task_that_needs_several_cores_is_not_passed_over_by_the_short_ones_behind_it():
    """The best-ranked task waits for its cores and the tasks behind it wait with it: were they let into the cores it
    waits for, they would keep taking them, and the longest run would start last and run alone at the end."""
    started = []
    lock = threading.Lock()

    def task(key, cores, seconds, hold=0.0):
        def run(done):
            with lock:
                started.append(key)
            time.sleep(hold)

        return Task(key, run, seconds=seconds, cores=cores)

    tasks = [task("first", 1, 9, hold=0.2), task("heavy", 2, 8)] + [task(f"short{i}", 1, 1) for i in range(3)]
    run_longest_first(tasks, jobs=2, cores=2)
    assert started == ["first", "heavy", "short0", "short1", "short2"]
