"""init_world: what it hands torch.distributed, worked out by hand from the launcher's variables.
torch.distributed is replaced by a recorder, so the CUDA path is checked on a machine without
one."""

import pytest
import torch
from omegaconf import OmegaConf

from vapo_lab.distributed.world import init_world


def _cfg(nodes: int, per_node: int):
    return OmegaConf.create(
        {"trainer": {"strategy": "fsdp", "nodes": nodes, "nproc_per_node": per_node}}
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
