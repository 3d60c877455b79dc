"""A report measured in several sittings: some exercises now, the rest kept from the report already written.

``oomlab dev verify --exercise ID`` and ``oomlab dev equivalence --exercise ID`` measure only
the exercises named and :func:`merge` their rows into the committed report. That saves a
maintainer who edited one exercise the whole course's GPU time, and lets a course too long
for one sitting be measured in parts. A row is kept only where it is exactly what a full
sitting would write now: the same measuring code (its fingerprint), GPU, torch and runs at a
time, an exercise the course still has and, for ``verify.json``, the same sources. Any other
row is dropped and named, never carried over as if it were current, so the staleness tests
still see what is missing.
"""

from __future__ import annotations

from collections.abc import Callable

# What every row of one report must share: a report mixing them would state one GPU, one torch,
# one code and one parallelism that some of its rows were not measured with.
SAME_SITTING = ("code", "gpu", "torch", "jobs", "runner")


def merge(
    old: dict | None,
    new: dict,
    rows_key: str,
    exercise_of: Callable[[dict], str],
    course_ids: list[str],
    stale: Callable[[dict], str | None] = lambda _row: None,
    wall_keys: tuple[str, ...] = ("wall_s",),
) -> tuple[dict, list[str]]:
    """``new`` (a sitting of some exercises) with the rows of ``old`` it did not measure, and why any were dropped.

    ``rows_key`` names the list of rows, ``exercise_of`` reads a row's exercise and ``stale``
    says why an old row no longer describes its exercise (None while it does). Rows come out in course order; the
    wall times add up and ``sittings`` counts the sittings behind the report.
    """
    measured = {exercise_of(r) for r in new[rows_key]}
    dropped: list[str] = []
    kept: list[dict] = []
    if old is not None:
        differ = [k for k in SAME_SITTING if k in new and old.get(k) != new.get(k)]
        candidates = [r for r in old.get(rows_key, []) if exercise_of(r) not in measured]
        if differ and candidates:
            names = sorted({exercise_of(r) for r in candidates})
            dropped.append(f"{', '.join(names)}: measured with another {', '.join(differ)}")
        else:
            for r in candidates:
                ex = exercise_of(r)
                if ex not in course_ids:
                    dropped.append(f"{ex}: no longer in the course")
                elif why := stale(r):
                    dropped.append(f"{ex}: {why}")
                else:
                    kept.append(r)
    order = {ex: i for i, ex in enumerate(course_ids)}
    rows = sorted(kept + new[rows_key], key=lambda r: order.get(exercise_of(r), len(order)))  # stable: runs keep their order
    merged = dict(new, **{rows_key: rows})
    if kept:
        merged["sittings"] = old.get("sittings", 1) + 1
        for key in wall_keys:
            merged[key] = round(old.get(key, 0) + new[key], 1)
    else:
        merged["sittings"] = 1
    return merged, sorted(set(dropped))


def merge_verify(old: dict | None, new: dict, exercises) -> tuple[dict, list[str]]:
    """``verify.json`` from a sitting of some exercises and the rows of the last report still current."""
    from oomlab.grading.truth import all_as_expected, row_runs, stale

    by_id = {ex.id: ex for ex in exercises}
    merged, dropped = merge(
        old,
        new,
        "exercises",
        lambda row: row["id"],
        list(by_id),
        stale=lambda row: stale(row, by_id[row["id"]]),
    )
    rows = merged["exercises"]
    merged["runs"] = sum(row_runs(row) for row in rows)
    merged["ok"] = all_as_expected(rows)
    return merged, dropped


def merge_equivalence(old: dict | None, new: dict, exercises, kept_in_verify: set[str] | None = None) -> tuple[dict, list[str]]:
    """``equivalence.json`` likewise; written beside ``verify.json``, an exercise's old rows stay only where its rows there stayed."""
    merged, dropped = merge(
        old,
        new,
        "rows",
        lambda row: row["exercise"],
        [ex.id for ex in exercises],
        stale=lambda row: (
            None if kept_in_verify is None or row["exercise"] in kept_in_verify else "its rows in verify.json were dropped"
        ),
        wall_keys=("fresh_wall_s", "forked_wall_s"),
    )
    merged["runs"] = len(merged["rows"])
    merged["all_equal"] = all(r["equal"] for r in merged["rows"])
    return merged, dropped
