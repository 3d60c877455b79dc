"""What ``oomlab dev figures`` keeps of a tool run's allocator snapshot."""

from oomlab.site.figures import SNAPSHOT_LIMIT_BYTES, keep_snapshot


def test_a_snapshot_small_enough_to_download_is_copied(tmp_path):
    snapshot = tmp_path / "snapshot.pickle"
    snapshot.write_bytes(b"x" * 1000)
    kept, left_out = keep_snapshot(snapshot, tmp_path / "ex-bug-snapshot.pickle")
    assert kept == "ex-bug-snapshot.pickle" and left_out is None
    assert (tmp_path / kept).read_bytes() == snapshot.read_bytes()


def test_a_snapshot_too_large_to_ship_is_left_out_with_its_size_and_an_old_copy_removed(tmp_path):
    snapshot = tmp_path / "snapshot.pickle"
    snapshot.write_bytes(b"x" * (SNAPSHOT_LIMIT_BYTES + 1))
    old = tmp_path / "ex-bug-snapshot.pickle"
    old.write_bytes(b"from an earlier run")
    kept, left_out = keep_snapshot(snapshot, old)
    assert kept is None and "over the 5.0 MiB" in left_out
    assert not old.exists()


# --------------------------------------------------------------------------- the bug and the fix compared


def side(label: str, ended: str, site_bytes: int, holder_bytes: int) -> dict:
    """A side as ``side_from_run`` makes it, with the run's own folders in it."""
    from oomlab.units import MIB

    return {
        "label": label,
        "source": "run",
        "path": f"/home/someone/course/.oomlab/figures/{label}/snapshot",
        "ended": ended,
        "headline": f"{label}'s snapshot",
        "figures": {"allocated": site_bytes + 40 * MIB, "reserved": site_bytes + 64 * MIB, "segments": 3, "peak_allocated": None},
        "peak_source": "allocator",
        "sites": [
            {
                "label": "train.py:31",
                "file": "/home/someone/course/exercises/x/train.py",
                "line": 31,
                "function": "<module>",
                "code": "features.append(encoder(x))",
                "bytes": site_bytes,
                "blocks": 4,
            },
            {
                "label": "train.py:9",
                "file": "/home/someone/course/exercises/x/train.py",
                "line": 9,
                "function": "<module>",
                "code": "model = Net().cuda()",
                "bytes": 40 * MIB,
                "blocks": 2,
            },
        ],
        "sites_complete": True,
        "holders": [
            {
                "name": "global 'features' (train.py:12)",
                "what": "global 'features'",
                "bytes": holder_bytes,
                "label": "culprit",
                "largest_path": "features[3]",
            }
        ],
        "holders_complete": True,
        "notes": [],
    }


def compared() -> dict:
    from oomlab.tools.compare.analysis import compare
    from oomlab.units import MIB

    return compare(side("ex", "OOM at train.py:31", 800 * MIB, 800 * MIB), side("ex-fix", "finished", 0, 0), top=5)


def test_what_the_site_keeps_of_a_comparison_names_no_folder_of_the_machine():
    import json

    from oomlab.site.figures import for_the_site

    kept = for_the_site(compared())
    text = json.dumps(kept)
    assert "/home/someone" not in text
    assert kept["kind"] == "shrank" and kept["shrunk"][0]["code"] == "features.append(encoder(x))"
    assert kept["holders"][0]["growth"] < 0 and kept["sides"]["b"]["ended"] == "finished"


def test_the_compare_fold_shows_the_figures_the_lines_the_holders_and_the_picture():
    from oomlab.site.compare_fold import COMPARE_FOLD, compare_fold
    from oomlab.site.figures import for_the_site

    entry = {**for_the_site(compared()), "files": ["ex-compare.png"]}
    md = "\n".join(compare_fold(entry, "ex", "solutions/ex/train.py", "exercises/ex.md", "NVIDIA H200, torch 2.11, 2026-12-02"))
    assert md.startswith(f'??? abstract "{COMPARE_FOLD}"')
    body = [line for line in md.split("\n")[1:] if line]
    assert all(line.startswith("    ") for line in body), "everything is inside the fold"
    assert "`oomlab compare ex solutions/ex/train.py`" in md and "(OOM at train.py:31)" in md
    assert "| allocated (in live blocks (tensors)) | 840.0 MiB | 40.0 MiB | -800.0 MiB |" in md
    assert "| segments (cudaMalloc'd segments the allocator holds) | 3 | 3 | +0 |" in md
    assert "peak allocated" not in md, "a figure neither side has is left out"
    assert "| train.py:31 | `features.append(encoder(x))` | 800.0 MiB | 0 B | -800.0 MiB |" in md
    assert "global 'features'" in md and "Grew most" not in md
    assert "](../figures/ex-compare.png)" in md


def test_an_exercise_without_a_comparison_gets_no_fold():
    from oomlab.site.compare_fold import compare_fold

    assert compare_fold(None, "ex", "solutions/ex/train.py", "exercises/ex.md", "?") == []
