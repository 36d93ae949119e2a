"""A cell's status file: updates merge into the record and are atomic."""

from vapo_lab.launch.status import read_status, write_status


def test_status_updates_merge_and_are_atomic(tmp_path):
    grid_dir = tmp_path / "runs" / "grids" / "g-12345678"
    write_status(grid_dir, "a", state="running", step=1, attempts=1)
    write_status(grid_dir, "a", step=2)
    st = read_status(grid_dir, "a")
    assert (st["state"], st["step"], st["attempts"]) == ("running", 2, 1)
    assert not list((grid_dir / "status").glob(".*tmp"))
