"""Grid cells that are many-rank runs (trainer.strategy=fsdp over nodes x nproc_per_node ranks):
one job array per shape on Slurm (multi-task jobs), torchrun on the local launcher, refused on Ray;
every rank runs the cell, rank 0 alone writes its status file.

The fast tests use fake runs and dry runs; the slow ones (`pytest -m slow`) train a 2-rank cell
of the small test config to the end on the local Slurm (shared/slurm) and with the local launcher.
"""

import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vapo_lab.distributed.world import World
from vapo_lab.launch.actions import run_grid
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.cell import CellJob, cell_ranks, run_cell
from vapo_lab.launch.grid import CellSpec, load_grid
from vapo_lab.launch.slurm import SlurmLauncher, _array_parameters, slurm_parameters, task_groups
from vapo_lab.launch.status import read_status, write_status
from vapo_lab.runs.metrics_log import record_kind

from .conftest import SMALL

FSDP2 = ["trainer.strategy=fsdp", "trainer.nproc_per_node=2"]
SLURM = ["launcher.slurm.cpus_per_task=1", "launcher.slurm.mem_gb=1", "launcher.slurm.time_min=15"]


def _spec(key, strategy="single", nodes=1, per_node=1):
    config = {
        "trainer": {
            "strategy": strategy,
            "nodes": nodes,
            "nproc_per_node": per_node,
            "total_steps": 3,
        },
        "tracking": {},
    }
    return CellSpec(
        grid_id="g-1",
        name=key,
        algo="vapo",
        drop=[],
        overrides=[],
        seed=0,
        config_hash="0" * 16,
        key=key,
        config=config,
        choices={"algo": "vapo"},
    )


def _grid(tmp_path, cells):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: g\nseeds: [0]\ncells:\n"
        + "".join(
            f"  - {{name: {name}, algo: vapo, overrides: [{', '.join(ov)}]}}\n"
            for name, ov in cells
        )
    )
    return load_grid(path)


# ---- grouping and the sbatch parameters of a multi-task array ------------------------------------


def test_a_cells_ranks_are_nodes_by_nproc_under_fsdp_only():
    assert cell_ranks(_spec("a").config) == (1, 1)
    assert cell_ranks(_spec("b", "fsdp", 2, 4).config) == (2, 4)
    assert cell_ranks(_spec("c", "fsdp").config) == (1, 1)  # fsdp on one rank: one process


def test_cells_are_grouped_by_job_shape_in_first_seen_order():
    specs = [
        _spec("a"),
        _spec("b", "fsdp", 1, 2),
        _spec("c"),
        _spec("d", "fsdp", 2, 2),
        _spec("e", "fsdp", 1, 2),
    ]
    groups = task_groups(specs, lambda s: s.config)
    assert list(groups) == [(1, 1), (1, 2), (2, 2)]
    assert {shape: [s.key for s in g] for shape, g in groups.items()} == {
        (1, 1): ["a", "c"],
        (1, 2): ["b", "e"],
        (2, 2): ["d"],
    }


def test_a_multi_task_array_asks_one_task_per_rank_and_one_gpu_per_rank():
    params = slurm_parameters(
        {"cpus_per_task": 3, "mem_gb": 4, "gpus_per_task": 1, "nodes": 1}, "vapo-g"
    )
    one = _array_parameters(params, "7")
    assert "ntasks_per_node" not in one and one["gpus_per_task"] == 1 and one["mem"] == "4GB"
    many = _array_parameters(params, "7", 2, 4)
    assert (many["nodes"], many["ntasks_per_node"], many["cpus_per_task"]) == (2, 4, 3)
    # every task sees the node's GPUs (it takes cuda:LOCAL_RANK), one per rank; --mem is per node
    assert many["gpus_per_node"] == 4 and "gpus_per_task" not in many and many["mem"] == "16GB"
    assert many["dependency"] == "afterok:7" and many["srun_args"] == ["--kill-on-bad-exit=1"]
    assert many["job_name"] == "vapo-g-2x4"
    cpu = _array_parameters(slurm_parameters({"gpus_per_task": 0}, "vapo-g"), "7", 1, 2)
    assert "gpus_per_node" not in cpu and "gpus_per_task" not in cpu


def test_dry_run_shows_one_array_per_shape_with_the_multi_task_script(tmp_path):
    specs = [_spec("a"), _spec("b", "fsdp", 2, 2), _spec("c")]
    text = SlurmLauncher().dry_run_text(specs, {"gpus_per_task": 1, "mem_gb": 2}, tmp_path, "g-1")
    scripts = text.split("# sbatch script ")[1:]
    assert [s.splitlines()[0] for s in scripts] == [
        "1: the prepare job (base model, reward model, pretrained critic)",
        "2: the job array of 2 cells, after the prepare job",
        "3: the job array of 1 cells on 2 node(s) x 2 tasks (4 ranks each), after the prepare job",
    ]
    single, multi = scripts[1], scripts[2]
    assert "#SBATCH --array=0-1%2" in single and "--ntasks-per-node" not in single
    assert "#SBATCH --gpus-per-task=1" in single and "--kill-on-bad-exit" not in single
    for line in (
        "#SBATCH --array=0-0%1",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --mem=4GB",
        "#SBATCH --job-name=vapo-g-1-2x2",
        "#SBATCH --dependency='afterok:<prepare job id>'",
    ):
        assert line in multi, line
    assert "--gpus-per-task" not in multi
    assert "srun --unbuffered" in multi and "--kill-on-bad-exit=1" in multi


def test_cli_dry_run_of_a_grid_with_a_two_rank_cell(in_tmp):
    from typer.testing import CliRunner

    from vapo_lab.cli import app

    (in_tmp / "g.yaml").write_text(
        "name: g\nseeds: [0]\ncells:\n  - {name: one, algo: vapo}\n"
        "  - {name: two, algo: vapo, overrides: [trainer.strategy=fsdp, "
        "trainer.nproc_per_node=2]}\n"
    )
    r = CliRunner().invoke(app, ["sweep", "g.yaml", "--dry-run", "--launcher", "slurm"])
    assert r.exit_code == 0, r.output
    assert r.output.count("would run") == 2 and r.output.count("#SBATCH --array=0-0%1\n") == 2
    assert (
        "on 1 node(s) x 2 tasks (2 ranks each)" in r.output
        and "#SBATCH --ntasks-per-node=2" in r.output
    )
    assert not (in_tmp / "runs").exists()


# ---- launchers that cannot run a cell refuse it before anything is submitted ---------------------


def test_ray_refuses_a_many_rank_cell_in_one_line_naming_the_other_launchers(in_tmp):
    grid = _grid(in_tmp, [("one", []), ("two", FSDP2)])
    with pytest.raises(LaunchError) as e:
        run_grid(grid, ["trainer.total_steps=2"], "ray", False, True, log=print, out=print)
    msg = str(e.value)
    assert "\n" not in msg
    assert (
        msg.startswith("cell two-s0-")
        and "runs on 2 ranks (trainer.nodes=1 x trainer.nproc_per_node=2)" in msg
    )
    assert msg.endswith(
        "the Ray launcher runs one process per cell; use --launcher local (torchrun on this "
        "machine) or --launcher slurm (a multi-task job); nothing was submitted"
    )
    assert not (in_tmp / "runs" / "grids").exists() or not list(
        (in_tmp / "runs" / "grids").rglob("*.json")
    )


def test_local_launcher_refuses_a_cell_on_many_nodes(in_tmp):
    grid = _grid(in_tmp, [("two", [*FSDP2, "trainer.nodes=2"])])
    with pytest.raises(
        LaunchError,
        match=r"cell two-s0-\w+ runs on trainer.nodes=2 nodes: the local launcher "
        r"starts the ranks of this machine only; use --launcher slurm",
    ):
        run_grid(grid, ["trainer.total_steps=2"], "local", False, True, log=print, out=print)
    assert not (in_tmp / "runs" / "grids").exists() or not list(
        (in_tmp / "runs" / "grids").rglob("*.json")
    )


# ---- every rank runs the cell; rank 0 alone writes its status ------------------------------------


class FakeTrainer:
    """A Trainer that counts its steps (on rank 0, as Trainer does), or fails on construction:
    ``fail[rank]`` is the exception to raise, or a function that raises it."""

    fail: dict = {}

    def __init__(self, cfg, choices, **kwargs):
        rank = int(os.environ["RANK"])
        if rank in FakeTrainer.fail:
            fail = FakeTrainer.fail[rank]
            if callable(fail) and not isinstance(fail, BaseException):
                fail()
            raise fail
        self.run_id, self.run_dir, self.step = f"r{rank}", Path("runs") / "x", 0
        self.world = World(rank, 2, rank)
        self.total = int(cfg.trainer.total_steps)

    def start(self):
        pass

    def close(self):
        pass

    def train(self, on_step):
        for step in range(1, self.total + 1):
            if self.world.main:
                on_step(step, {})
        return SimpleNamespace(
            steps=self.total, final_eval=0.5, best_eval=0.5, base_eval=0.1, checkpoint=None
        )


@pytest.fixture
def fake_cell(tmp_path, monkeypatch):
    monkeypatch.setattr("vapo_lab.trainer.trainer.Trainer", FakeTrainer)
    monkeypatch.setattr("vapo_lab.stop.sigterm_interrupts", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)  # run_cell moves into the job's working directory: restored after
    FakeTrainer.fail = {}
    spec = _spec("two", "fsdp", 1, 2)
    job = CellJob(
        spec=spec, grid_dir=str(tmp_path / "grids" / "g-1"), cwd=str(tmp_path), experiment="g"
    )

    def as_rank(rank):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        return job

    return as_rank


def test_only_rank_0_writes_the_status_file(fake_cell):
    job = fake_cell(1)
    grid_dir = Path(job.grid_dir)
    write_status(grid_dir, job.spec.key, state="pending", launcher="slurm")
    before = read_status(grid_dir, job.spec.key)
    assert run_cell(job) == {"state": "finished", "rank": 1, "step": 3}
    assert read_status(grid_dir, job.spec.key) == before  # rank 1 never touched it

    job = fake_cell(0)
    final = run_cell(job)
    assert final["state"] == "finished" and final["step"] == 3 and final["attempts"] == 1
    assert final["run_id"] == "r0" and final["pid"] == os.getpid() and final["final_eval"] == 0.5


def test_a_failing_rank_fails_the_cell_with_its_own_message(fake_cell, monkeypatch):
    FakeTrainer.fail = {1: ValueError("bad batch on this rank")}
    job = fake_cell(1)
    grid_dir, rank1_file = (
        Path(job.grid_dir),
        Path(job.grid_dir) / "status" / f"{job.spec.key}.rank1.error",
    )
    with pytest.raises(ValueError):
        run_cell(job)
    assert read_status(grid_dir, job.spec.key) == {"state": "pending"}  # no status file from rank 1
    assert rank1_file.read_text() == "rank 1: ValueError: bad batch on this rank\n"
    line = rank1_file.read_text()

    def rank1_fails_then_rank0_sees_the_run_break():
        # while rank 0 runs, rank 1 fails first and leaves its line; rank 0's own error is only
        # the consequence, and the cell records rank 1's
        rank1_file.write_text(line)
        raise RuntimeError("Connection closed by peer")

    FakeTrainer.fail = {0: rank1_fails_then_rank0_sees_the_run_break}
    with pytest.raises(RuntimeError):
        run_cell(fake_cell(0))
    st = read_status(grid_dir, job.spec.key)
    assert st["state"] == "failed" and st["error"] == "rank 1: ValueError: bad batch on this rank"
    assert not list((grid_dir / "status").glob("*.error"))  # read, then removed

    # rank 0 failing alone names itself; an earlier attempt's rank files are not this one's
    (grid_dir / "status" / f"{job.spec.key}.rank1.error").write_text(
        "rank 1: KeyboardInterrupt: signal 15\n"
    )
    FakeTrainer.fail = {0: OSError("disk full")}
    with pytest.raises(OSError):
        run_cell(fake_cell(0))
    st = read_status(grid_dir, job.spec.key)
    assert st["error"] == "rank 0: OSError: disk full" and st["attempts"] == 2


def test_a_finished_cell_returns_at_once_on_every_rank(fake_cell):
    FakeTrainer.fail = {0: AssertionError("must not run"), 1: AssertionError("must not run")}
    job = fake_cell(1)
    write_status(Path(job.grid_dir), job.spec.key, state="finished", step=3)
    assert run_cell(job)["state"] == "finished"
    assert run_cell(fake_cell(0))["state"] == "finished"


def test_a_cell_job_goes_to_its_ranks_as_json(tmp_path):
    spec = _spec("two", "fsdp", 1, 2)
    job = CellJob(
        spec=spec, grid_dir=str(tmp_path), cwd=str(tmp_path), experiment="g", parent_run_id="p1"
    )
    again = CellJob.from_json(job.to_json())
    assert again == job and again.world_size == 2 and again.spec.config == spec.config


def test_each_task_of_a_multi_task_job_gets_its_rank(tmp_path, monkeypatch):
    """submitit's local executor starts the tasks as Slurm would; each sets its torch variables
    from the job (a RANK / MASTER_PORT exported from the submitting shell is not the job's)."""
    import submitit

    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("MASTER_PORT", "1234")
    ex = submitit.LocalExecutor(folder=tmp_path / "%j")
    ex.update_parameters(tasks_per_node=2, timeout_min=2)

    def task():  # self-contained: the tasks unpickle it without importing this test module
        import os

        from vapo_lab.launch.cell import join_slurm_ranks

        join_slurm_ranks()
        return {
            k: os.environ.get(k)
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }

    envs = ex.submit(task).results()
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] != "1234"
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]


# ---- slow: a 2-rank cell trained to the end ------------------------------------------------------


def _check_two_rank_run(run_dir: Path, steps: int) -> None:
    """The run ended: each training step logged once (by rank 0), and its checkpoints are sharded
    over 2 ranks (DCP: a .metadata written last, one shard file per rank)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(d["step"] for d in records if record_kind(d) != "pretrain") == list(
        range(steps + 1)
    )
    dcp = run_dir / "checkpoints" / f"step_{steps:06d}" / "dcp"
    assert (dcp / ".metadata").is_file()
    assert sorted(p.name for p in dcp.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_a_two_task_slurm_job_trains_a_two_rank_cell_to_the_end(slurm, in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]  # VAPO
    t0 = time.time()
    sub = run_grid(
        grid, [*SMALL, *FSDP2, *SLURM, "tracking=none"], "slurm", False, True, log=print, out=print
    )
    (key,) = sub.submitted
    assert sub.results == {key: "finished"}, sub.results
    print(f"2-task Slurm cell: {time.time() - t0:.0f}s")
    st = read_status(sub.grid_dir, key)
    assert st["step"] == 3 and st["attempts"] == 1 and st["job_id"] == sub.job_ids[key]
    _check_two_rank_run(sub.grid_dir / "runs" / key, 3)
    job = sub.job_ids[key]
    logs = sorted((sub.grid_dir / "slurm_logs").rglob(f"{job}_*_log.out"))
    # two tasks, one job
    assert [p.name.removeprefix(f"{job}_").split("_")[0] for p in logs] == [
        "0",
        "1",
    ]
    assert "global_rank=1(2)" in logs[1].read_text()
    assert not list((sub.grid_dir / "status").glob("*.error"))


@pytest.mark.slow
def test_the_local_launcher_trains_a_two_rank_cell_with_torchrun_and_skips_it_when_done(in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]
    overrides = [*SMALL, *FSDP2, "tracking=none"]
    t0 = time.time()
    sub = run_grid(grid, overrides, "local", False, True, log=print, out=print)
    (key,) = sub.submitted
    assert sub.results == {key: "finished"}, sub.results
    print(f"2-rank local cell: {time.time() - t0:.0f}s")
    st = read_status(sub.grid_dir, key)
    assert st["step"] == 3 and st["attempts"] == 1 and st["state"] == "finished"
    _check_two_rank_run(sub.grid_dir / "runs" / key, 3)
    again = run_grid(grid, overrides, "local", False, True, log=print, out=print)
    assert again.submitted == [] and again.skipped_finished == [key]


@pytest.mark.slow
def test_a_two_rank_local_cell_that_fails_on_its_ranks_is_recorded_failed(in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]
    with pytest.raises(
        LaunchError,
        match=r"1 cell\(s\) failed: vapo-s0-\w+: failed: rank [01]: ConfigError: "
        r"trainer.device=cuda:0 but no CUDA GPU",
    ):
        run_grid(
            grid,
            [*SMALL, *FSDP2, "tracking=none", "trainer.device=cuda:0"],
            "local",
            False,
            True,
            log=print,
            out=print,
        )


@pytest.mark.slow
def test_a_two_rank_local_cell_whose_rank_is_killed_names_it_and_fails(in_tmp, monkeypatch):
    # before issue 49 the cell failed with the survivor's "Connection closed by peer"
    monkeypatch.setenv("VAPO_FAULT", "update@2")
    monkeypatch.setenv("VAPO_FAULT_RANK", "1")
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]
    with pytest.raises(LaunchError) as e:
        run_grid(grid, [*SMALL, *FSDP2, "tracking=none"], "local", False, True, print, print)
    want = (
        r"vapo-s0-\w+: failed: rank 1 died: killed by SIGKILL \(the out-of-memory killer, or "
        r"kill -9\) after step 1; the other ranks stopped after it\. The run is marked FAILED"
    )
    assert re.search(want, str(e.value)), str(e.value)
    (status,) = (in_tmp / "runs" / "grids").glob("*/status/*.json")
    assert json.loads(status.read_text())["state"] == "failed"
