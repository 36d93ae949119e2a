"""init_world: what it hands torch.distributed, worked out by hand from the launcher's variables.
torch.distributed is replaced by a recorder, so the CUDA path is checked on a machine without
one."""

from datetime import timedelta

import pytest
import torch
from omegaconf import OmegaConf

from vapo_lab.distributed.world import init_world
from vapo_lab.errors import ConfigError


def _cfg(nodes: int, per_node: int, mesh: str = "flat"):
    return OmegaConf.create(
        {
            "trainer": {
                "strategy": "fsdp",
                "nodes": nodes,
                "nproc_per_node": per_node,
                "mesh": mesh,
                "collective_timeout_min": 75,
            }
        }
    )


@pytest.fixture
def calls(monkeypatch):
    seen: dict = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(
        torch.distributed,
        "init_process_group",
        lambda backend, **kw: seen.update(backend=backend, **kw),
    )
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: seen.update(set_device=i))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # a node's GPUs, unless a test says
    return seen


def test_a_cuda_rank_is_bound_to_its_local_gpu_not_its_global_rank(monkeypatch, calls):
    # rank 5 of 2 nodes x 4 GPUs is the second GPU of node 1: a guess from the global rank is wrong
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    world = init_world(_cfg(2, 4).trainer, torch.device("cuda"))
    assert calls["backend"] == "nccl"
    assert calls["set_device"] == 1
    assert calls["device_id"] == torch.device("cuda", 1)
    assert (calls["rank"], calls["world_size"]) == (5, 8)
    assert (world.rank, world.size, world.local_rank, world.comm_device) == (5, 8, 1, "cuda")


def test_a_cpu_rank_uses_gloo_and_binds_no_device(monkeypatch, calls):
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    world = init_world(_cfg(1, 2).trainer, torch.device("cpu"))
    assert calls["backend"] == "gloo"
    assert calls["device_id"] is None
    assert "set_device" not in calls
    assert (world.rank, world.comm_device) == (1, "cpu")


def test_the_collective_timeout_is_the_configs(monkeypatch, calls):
    # the first collective after sampling waits for the slowest engine: the run's own bound
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    init_world(_cfg(1, 2).trainer, torch.device("cpu"))
    assert calls["timeout"] == timedelta(minutes=75)


def test_a_site_that_binds_one_gpu_per_task_uses_that_gpu(monkeypatch, calls):
    # Slurm --gpus-per-task=1: every task sees one GPU, index 0, whatever its local rank
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    init_world(_cfg(1, 4).trainer, torch.device("cuda"))
    assert calls["set_device"] == 0 and calls["device_id"] == torch.device("cuda", 0)


def test_a_rank_that_cannot_see_its_gpu_is_one_line(monkeypatch, calls):
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="LOCAL_RANK=3 but this process sees 2 GPUs"):
        init_world(_cfg(1, 4).trainer, torch.device("cuda"))


def test_hsdp_keeps_a_replica_a_node_and_flat_one_in_all(monkeypatch, calls):
    # rank 5 of 2 nodes x 4: torchrun numbers node 1's ranks 4-7, so LOCAL_RANK 1 = 5 % 4
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    assert init_world(_cfg(2, 4, "hsdp").trainer, torch.device("cuda")).replicas == 2
    assert init_world(_cfg(2, 4).trainer, torch.device("cuda")).replicas == 1


def test_hsdp_refuses_ranks_numbered_across_nodes_in_one_line(monkeypatch, calls):
    # Slurm --distribution=cyclic over 2 nodes of 2: rank 1 is node 1's first task, so the
    # shard group {0, 1} would span both nodes
    for k, v in {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(
        ConfigError,
        match=r"^trainer.mesh=hsdp shards within each node's 2 consecutive ranks, but rank 1 is "
        r"LOCAL_RANK=0 on its node, not 1: .* or set trainer.mesh=flat$",
    ):
        init_world(_cfg(2, 2, "hsdp").trainer, torch.device("cpu"))
    assert "backend" not in calls  # before any process group
    init_world(_cfg(2, 2).trainer, torch.device("cpu"))  # the flat layout does not care
