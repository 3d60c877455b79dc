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
