"""On many nodes every rank reads the run folder and the caches that rank 0 writes: a rank that
cannot see them stops the run on every rank, in one line, before any compute."""

from pathlib import Path

from tests.distributed.conftest import torchrun

HERE = Path(__file__).resolve().parent


def test_ranks_that_share_the_folders_go_on(tmp_path):
    torchrun(2, HERE / "rank_shared.py", str(tmp_path))
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["ok", "ok"]
    # the probes are gone: nothing is left in the run's folders
    assert not list((tmp_path / "shared" / "runs" / "x").iterdir())


def test_a_rank_that_does_not_see_them_stops_every_rank_in_one_line(tmp_path):
    torchrun(2, HERE / "rank_shared.py", str(tmp_path), "--apart")
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert lines[0] == lines[1]  # the same line on every rank
    assert lines[0].startswith("ConfigError: rank 1 does not see runs/x (the run folder)")
    assert "a file system every node shares" in lines[0] and "\n" not in lines[0]
