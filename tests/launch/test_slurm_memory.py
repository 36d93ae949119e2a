"""A Slurm job's host memory from its cells' plans (launcher.slurm.mem_gb unset), and a figure
below a GPU cell's plan refused before anything is submitted."""

import math

import pytest
from omegaconf import OmegaConf

from vapo_lab.config.compose import compose_config
from vapo_lab.config.plan import plan_run
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.slurm import (
    CPU_PROCESS_GB,
    GPU_PROCESS_GB,
    SlurmLauncher,
    _array_parameters,
    group_mem_gb,
    host_gb_per_rank,
    slurm_parameters,
)

GPU = {"gpus_per_task": 1}


def _config(*overrides: str) -> dict:
    # a grid cell's config as composed (the files are not read: a plan needs only the shape)
    cfg = compose_config(overrides=list(overrides), check=False).cfg
    return OmegaConf.to_container(cfg, resolve=True)


def test_a_paper_scale_rank_asks_for_its_share_of_the_plans_host_memory():
    paper = _config("scale=paper")
    # 8 ranks' pinned state, 16 B x 64.75B / 128 = 8.09 GB each, + rank 0's float32 (V, h)
    # embedding as the critic cache streams out (4 x 152,064 x 5,120 B = 3.11 GB): 67.86 GB a
    # node, 8.48 GB a rank, + a process's own 28 GB
    state = 16 * (32_763_876_352 + 31_985_313_793) / 128
    node = 8 * state + 4 * 152_064 * 5_120
    assert plan_run(OmegaConf.create(paper), 80e9).footprint.host_per_node == node
    gb, how = host_gb_per_rank(paper, GPU)
    assert gb == math.ceil(node / 8 / 1e9 + GPU_PROCESS_GB) == 37
    assert how == "8.5 of the plan's host memory a node + 28 a process"
    # unset: the array asks for it; a node's 8 ranks for 8 x 37
    assert group_mem_gb([paper], GPU) == 37
    params = slurm_parameters(GPU, "vapo-p")
    assert _array_parameters(params, "7", 16, 8, 37)["mem"] == "296GB"
    # set: as given
    assert group_mem_gb([paper], {**GPU, "mem_gb": 64}) == 64


def test_a_cpu_rank_asks_for_its_plans_need_and_a_process():
    default = _config("trainer.device=cpu")
    need = plan_run(OmegaConf.create(default), 1e12, device="cpu").footprint.need
    assert host_gb_per_rank(default, {})[0] == math.ceil(need / 1e9 + CPU_PROCESS_GB) == 3


def test_a_gpu_cell_given_less_host_memory_than_its_plan_is_refused(monkeypatch):
    monkeypatch.setattr("vapo_lab.launch.slurm.check_slurm", lambda settings: None)
    spec = type("Spec", (), {"name": "vapo", "config": _config("scale=paper")})()
    time = {"time_min": 24 * 60, "max_requeues": 1000}  # a paper-scale attempt's time fits
    with pytest.raises(LaunchError) as e:
        SlurmLauncher().preflight({**GPU, **time, "mem_gb": 8}, [spec])
    assert str(e.value) == (
        "launcher.slurm.mem_gb=8 is below the host memory a rank of cell vapo needs by its plan, "
        "37 GB (8.5 of the plan's host memory a node + 28 a process): set "
        "launcher.slurm.mem_gb=37, or leave it unset to take the plan's; nothing was submitted"
    )
    SlurmLauncher().preflight({**GPU, **time, "mem_gb": 37}, [spec])  # enough
    SlurmLauncher().preflight({**GPU, **time}, [spec])  # unset: the plan's
