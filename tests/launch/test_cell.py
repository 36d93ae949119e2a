"""A cell's job runs the config its grid composed (composed once), and prepares each cache set
once."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vapo_lab.config.compose import compose_config
from vapo_lab.launch.cell import CellJob, cell_config, prepare
from vapo_lab.launch.grid import config_hash, load_grid


@pytest.fixture(scope="module")
def table1_specs():
    specs = load_grid("table1", seeds=2).expand(
        ["tracking.uri=http://h:1", "trainer.total_steps=7"]
    )
    return {s.key: s for s in specs}


def _job(spec, root):
    return CellJob(
        spec=spec, grid_dir=str(root / "grids" / spec.grid_id), cwd=str(root), experiment="table1"
    )


@pytest.mark.parametrize("name", ["ppo", "dapo", "vapo-no-clip_higher"])
def test_a_cells_config_is_what_composing_it_where_it_runs_gives(table1_specs, tmp_path, name):
    spec = next(s for s in table1_specs.values() if s.name == name and s.seed == 1)
    job = _job(spec, tmp_path)
    # composing the cell again with where it runs and logs: what every job did before the grid
    # carried the composed config; the run's config.yaml, params and config hash must not change
    where = [
        f"output_dir={Path(job.grid_dir) / 'runs'}",
        f"run_name={spec.key}",
        f"tracking.experiment={job.experiment}",
    ]
    again = compose_config(algo=spec.algo, drop=spec.drop, overrides=[*spec.overrides, *where])
    cfg, choices = cell_config(job)
    assert OmegaConf.to_yaml(cfg, resolve=True) == OmegaConf.to_yaml(again.cfg, resolve=True)
    assert choices == again.choices
    assert config_hash(OmegaConf.to_container(cfg, resolve=True)) == spec.config_hash
    assert (
        cfg.output_dir == str(tmp_path / "grids" / spec.grid_id / "runs")
        and cfg.run_name == spec.key
    )


def test_cell_config_is_a_fresh_copy(table1_specs, tmp_path):
    spec = next(iter(table1_specs.values()))
    cfg, choices = cell_config(_job(spec, tmp_path))
    cfg.trainer.total_steps = 1
    choices["algo"] = "x"
    assert spec.config["trainer"]["total_steps"] == 7 and spec.choices["algo"] == spec.algo
    assert spec.config["output_dir"] == "runs"  # the grid's record and hash never see where it runs


def test_the_grid_record_lists_cells_without_their_config(table1_specs):
    spec = next(iter(table1_specs.values()))
    assert list(spec.to_record()) == [
        "grid_id",
        "name",
        "algo",
        "drop",
        "overrides",
        "seed",
        "config_hash",
        "key",
        "sweep",
    ]


def test_prepare_builds_each_cache_set_once(table1_specs, tmp_path, monkeypatch):
    built = []

    def prepare_caches(config, log):
        built.append((config.seed, config.trainer.strategy, config.algo.name))

    monkeypatch.setattr("vapo_lab.trainer.caches.prepare_caches", prepare_caches)
    monkeypatch.chdir(tmp_path)  # prepare moves into the jobs' working directory: restored after
    jobs = [_job(s, tmp_path) for s in table1_specs.values()]
    lines = prepare(jobs)
    # 20 runs (10 cells x 2 seeds): seeds share caches, and so do the VAPO variants whose
    # component changes no cache (clip_higher, token_level_loss, positive_lm_loss): 7 sets
    assert len(built) == len(lines) == 7
    assert all(seed == 0 and strategy == "single" for seed, strategy, _ in built)
    assert [a for _, _, a in built][:3] == ["ppo", "dapo", "vapo"]


def test_slurms_prepare_job_builds_base_models_only(tmp_path, monkeypatch):
    """Slurm's prepare job has a time limit and no requeue: it builds the base model, and the
    cell builds its critic caches (resumable, one build a key) when it runs."""
    from vapo_lab.launch.grid import load_grid

    specs = load_grid("table1", seeds=1).expand(["tracking.uri=http://h:1"])
    vapo = next(s for s in specs if s.name == "vapo")
    bases, trainers = [], []
    monkeypatch.setattr("vapo_lab.basemodel.build.build_base_for", lambda *a, **k: bases.append(1))
    monkeypatch.setattr(
        "vapo_lab.trainer.caches.prepare_caches", lambda *a, **k: trainers.append(1)
    )
    monkeypatch.chdir(tmp_path)
    (line,) = prepare([_job(vapo, tmp_path)], critic=False)
    assert bases == [1] and trainers == []
    assert line.endswith("(the cell builds its critic caches when it runs)")
    prepare([_job(vapo, tmp_path)])  # the local launcher's: the critic's caches too
    assert trainers == [1]


def test_prepare_leaves_a_many_rank_cells_critic_caches_to_its_ranks(tmp_path, monkeypatch):
    """A 2-rank cell's reward model and pretrained critic are built by its own ranks together
    (keyed by the rank count, on the cell's devices); the prepare job builds only the base model
    they share."""
    from vapo_lab.launch.grid import load_grid

    specs = load_grid("table1", seeds=1).expand(
        ["tracking.uri=http://h:1", "trainer.strategy=fsdp", "trainer.nproc_per_node=2"]
    )
    vapo = next(s for s in specs if s.name == "vapo")
    bases, trainers = [], []
    monkeypatch.setattr("vapo_lab.basemodel.build.build_base_for", lambda *a, **k: bases.append(1))
    monkeypatch.setattr(
        "vapo_lab.trainer.caches.prepare_caches", lambda *a, **k: trainers.append(1)
    )
    monkeypatch.chdir(tmp_path)
    (line,) = prepare([_job(vapo, tmp_path)])
    assert bases == [1] and trainers == []
    assert (
        line.startswith("prepared vapo: base model")
        and "its 2 ranks build the critic caches" in line
    )
