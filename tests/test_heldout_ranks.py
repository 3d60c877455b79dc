"""The tools on every rank of held-out torchrun jobs, on a real GPU: two gloo ranks sharing it.

Each script in tests/heldout/ranks/ is a job of two data-parallel ranks with one
problem the course's exercises do not show (one rank's leak; an OOM skipped on
one rank that desynchronises the job); tests/heldout/ranks/expected.toml says
what the view across ranks must say. The hunt runs as ``oomlab hunt torchrun
--nproc-per-node 2 SCRIPT --budget B`` runs it. The GPU tests skip cleanly where
there is no GPU; the manifest's own checks run everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

JOBS = Path(__file__).resolve().parent / "heldout" / "ranks"
EXPECTED = tomllib.loads((JOBS / "expected.toml").read_text(encoding="utf-8"))
FIELDS = {"budget", "first_failure", "why", "culprit", "desynchronised", "mismatch", "differs"}


def test_every_heldout_job_has_one_expectation_and_each_reads():
    from oomlab.tools.ranks.analysis import COLUMNS
    from oomlab.units import parse_size

    assert sorted(p.stem for p in JOBS.glob("*.py")) == sorted(EXPECTED)
    for name, case in EXPECTED.items():
        assert set(case) <= FIELDS and {"budget", "first_failure", "desynchronised"} <= set(case), name
        assert parse_size(case["budget"]) > 0
        for pattern in [*case.get("why", {}).values(), *case.get("culprit", {}).values()]:
            re.compile(pattern)
        assert set(case.get("differs", [])) <= {key for key, _ in COLUMNS}, name
        source = (JOBS / f"{name}.py").read_text(encoding="utf-8")
        assert "cuda" in source and 'init_process_group("gloo")' in source, f"{name}: gloo ranks on the GPU"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_view_across_ranks_names_the_rank_and_the_holder(name, tmp_path):
    from oomlab.cli.tools import tool_options
    from oomlab.tools.hunt.analysis import stable_name
    from oomlab.tools.run import resolve, run_tool_on_ranks
    from oomlab.units import parse_size

    case = EXPECTED[name]
    target = resolve(["torchrun", "--nproc-per-node", "2", str(JOBS / f"{name}.py")], budget=case["budget"])
    result = run_tool_on_ranks(target, "hunt", tmp_path / name, tool_options("hunt"))
    rows = {row["rank"]: row for row in result["ranks"]}
    summary = f"{name}: {result['headline']} | " + " | ".join(f"rank {r}: {row['why']}" for r, row in rows.items())

    assert result["first_failure"] == case["first_failure"], summary
    for rank, pattern in case.get("why", {}).items():
        assert re.search(pattern, rows[int(rank)]["why"]), summary
    for rank, pattern in case.get("culprit", {}).items():
        assert re.search(pattern, stable_name(rows[int(rank)]["culprit"] or "")), summary
    assert result["desynchronised"] == case["desynchronised"], summary
    mismatch = (result["collective_mismatch"] or {}).get("by_name", {})
    assert sorted(mismatch) == sorted(case["mismatch"]), summary
    differ = {d["figure"] for d in result["differences"]}
    assert set(case["differs"]) <= differ, summary
    # Every rank ran on the GPU under its budget, and the driver saw each one's process.
    for row in rows.values():
        assert row.get("peak_reserved") and row["peak_reserved"] <= parse_size(case["budget"]), summary
        assert row.get("driver_peak"), summary
