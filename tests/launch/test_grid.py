"""Grid files -> cells: expansion, config hashes, sweeps and bad grid files (no runs here)."""

import pytest

from vapo_lab.errors import ConfigError
from vapo_lab.launch.grid import builtin_grids, config_hash, drop_grid, load_grid, sweep_points
from vapo_lab.registry.components import COMPONENTS

from .conftest import GRID3

# a Table 1 row per component of the registry, in its order (its names are checked against the
# paper's Table 1 in tests/test_components.py)
TABLE1_DROPS = [c.name for c in COMPONENTS]


def test_table1_is_ppo_dapo_vapo_and_vapo_without_each_component():
    grid = load_grid("table1")
    assert [c["algo"] for c in grid.cells[:3]] == ["ppo", "dapo", "vapo"]
    assert [c["drop"] for c in grid.cells[3:]] == [[d] for d in TABLE1_DROPS]
    specs = grid.expand()
    assert len(specs) == 10 and len({s.config_hash for s in specs}) == 10
    assert len({s.grid_id for s in specs}) == 1 and specs[0].grid_id.startswith("table1-")
    assert len(load_grid("table1", seeds=3).seeds) == 3
    assert "table1" in builtin_grids() and "lr_sweep" in builtin_grids()


def test_grid_id_and_hashes_are_stable_and_follow_the_config_not_where_it_runs(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(GRID3)
    a = load_grid(path).expand(["trainer.total_steps=5"])
    b = load_grid(path).expand(["trainer.total_steps=5"])
    assert [s.config_hash for s in a] == [s.config_hash for s in b] and a[0].grid_id == b[0].grid_id
    c = load_grid(path).expand(
        [
            "trainer.total_steps=5",
            "launcher=slurm",
            "tracking.uri=http://h:1",
            "output_dir=elsewhere",
        ]
    )
    assert [s.config_hash for s in a] == [s.config_hash for s in c] and a[0].grid_id == c[0].grid_id
    d = load_grid(path).expand(["trainer.total_steps=6"])
    assert (
        not {s.config_hash for s in a} & {s.config_hash for s in d} and a[0].grid_id != d[0].grid_id
    )


def test_config_hash_ignores_only_output_and_tracking_keys():
    base = {
        "seed": 0,
        "trainer": {"actor_lr": 1e-4},
        "output_dir": "runs",
        "tracking": {"uri": None},
    }
    assert config_hash(base) == config_hash(
        {**base, "output_dir": "x", "tracking": {"uri": "http://h"}}
    )
    assert config_hash(base) != config_hash({**base, "seed": 1})
    assert config_hash(base) != config_hash({**base, "trainer": {"actor_lr": 2e-4}})


def test_sweep_points_are_the_cartesian_product_of_hydra_sweeps():
    points = sweep_points({"trainer.actor_lr": "1e-5,3e-5", "seed": "range(0,2)"})
    assert points == [
        {"trainer.actor_lr": "1e-05", "seed": "0"},
        {"trainer.actor_lr": "1e-05", "seed": "1"},
        {"trainer.actor_lr": "3e-05", "seed": "0"},
        {"trainer.actor_lr": "3e-05", "seed": "1"},
    ]
    assert sweep_points({}) == [{}]
    assert sweep_points({"loss.eps_high": "0.28"}) == [{"loss.eps_high": "0.28"}]


def test_a_sweep_grid_multiplies_cells_by_points_and_seeds(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: lr\nseeds: [0, 1]\nsweep: {trainer.actor_lr: '1e-5,3e-5'}\n"
        "cells:\n  - {name: vapo, algo: vapo}\n  - {name: dapo, algo: dapo}\n"
    )
    specs = load_grid(path).expand()
    assert len(specs) == 8
    assert {(s.name, s.sweep["trainer.actor_lr"], s.seed) for s in specs} == {
        (n, lr, seed) for n in ("vapo", "dapo") for lr in ("1e-05", "3e-05") for seed in (0, 1)
    }
    assert {s.overrides[-2] for s in specs} == {"trainer.actor_lr=1e-05", "trainer.actor_lr=3e-05"}
    assert all("-actor_lr" in s.key for s in specs)


def test_drop_grid_is_one_vapo_variant():
    (spec,) = drop_grid(["clip_higher", "group_sampling"]).expand()
    assert spec.algo == "vapo" and spec.drop == ["clip_higher", "group_sampling"]
    assert spec.name == "vapo-no-clip_higher-group_sampling"


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: x\n", "non-empty list `cells:`"),
        ("cells:\n  - {algo: vapo}\n", "needs a `name:`"),
        ("cells:\n  - {name: a, algo: vapo}\n  - {name: a, algo: ppo}\n", "two cells are named a"),
        ("cells:\n  - {name: a, algo: vapo, dorp: [x]}\n", "unknown keys ['dorp']"),
        ("colls: []\ncells:\n  - {name: a}\n", "unknown keys ['colls']"),
        ("seeds: 3\ncells:\n  - {name: a}\n", "`seeds` must be a non-empty list"),
        ("cells: [\n", "not valid YAML"),
    ],
)
def test_malformed_grid_files_are_named_with_the_fix(tmp_path, text, message):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="grid file") as e:
        load_grid(path)
    assert message in str(e.value)


def test_a_cell_that_does_not_compose_is_named(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: g\ncells:\n  - {name: ok, algo: vapo}\n"
        "  - {name: bad, algo: vapo, drop: [clip_highr]}\n"
    )
    with pytest.raises(ConfigError, match="cell bad") as e:
        load_grid(path).expand()
    assert "clip_higher" in str(e.value)  # the closest valid name


def test_two_cells_with_the_same_config_are_refused(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "cells:\n  - {name: a, algo: vapo}\n  - {name: b, algo: vapo, overrides: [seed=0]}\n"
    )
    with pytest.raises(ConfigError, match="compose the same config"):
        load_grid(path).expand()


def test_unknown_grid_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="table1"):
        load_grid("tabel1")


def test_bad_sweep_syntax_is_reported(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("sweep: {trainer.actor_lr: 'range(1,'}\ncells:\n  - {name: a}\n")
    with pytest.raises(ConfigError, match="sweep"):
        load_grid(path).expand()


def test_mini_grid_file_parses(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(GRID3)
    assert [s.name for s in load_grid(path).expand()] == ["ppo", "vapo", "vapo-no-clip_higher"]


def test_more_seeds_extend_the_same_grid(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(GRID3)
    one, three = load_grid(path, seeds=1).expand(), load_grid(path, seeds=3).expand()
    assert one[0].grid_id == three[0].grid_id
    assert {s.key for s in one} < {s.key for s in three} and len(three) == 9


# the files experiments/table1-small-gpu.yaml needs (not read by composition: fake paths do)
SMALL_GPU_PATHS = ["model.path=/models/Qwen2.5-1.5B", "task.train_path=/data/dapo-math-17k.jsonl"]


def test_table1_small_gpu_is_table1_at_scale_small_gpu():
    grid = load_grid("table1-small-gpu")
    assert "table1-small-gpu" in builtin_grids()
    assert grid.cells == load_grid("table1").cells and len(grid.cells) == 10
    assert grid.overrides == ["scale=small-gpu"] and grid.seeds == [0, 1, 2]
    specs = load_grid("table1-small-gpu", seeds=1).expand(SMALL_GPU_PATHS)
    assert [s.name for s in specs] == [c["name"] for c in load_grid("table1").cells]
    for s in specs:
        c = s.config
        assert c["scale"]["name"] == "small-gpu" and c["model"]["name"] == "hf"
        assert c["model"]["arch_name"] == "Qwen2.5-1.5B" and c["task"]["name"] == "math"
        assert c["rollout"]["backend"] == "vllm" and c["rollout"]["max_new_tokens"] == 8192
        assert c["rollout"]["responses_per_step"] == 2048
        assert (
            c["trainer"]["strategy"],
            c["trainer"]["nodes"],
            c["trainer"]["nproc_per_node"],
        ) == ("fsdp", 1, 8)
        # 16 samples a prompt under group sampling; 1 for vanilla PPO and VAPO without it
        single = s.name in ("ppo", "vapo-no-group_sampling")
        assert c["rollout"]["n_samples"] == (1 if single else 16)


def test_table1_small_gpu_without_its_files_names_both():
    with pytest.raises(ConfigError, match="model.path is required for model=hf") as e:
        load_grid("table1-small-gpu", seeds=1).expand()
    assert "task.train_path is required for task=math" in str(e.value)
