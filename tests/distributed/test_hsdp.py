"""trainer.mesh=hsdp: each model sharded within a node and replicated across nodes (FSDP2 on a 2-D
DeviceMesh), against the flat layout (sharded over every rank).

The slow tests start 4 CPU ranks (gloo) as 2 "nodes" of 2: two torchrun agents, so that ranks are
numbered node by node as on a cluster (tests/distributed/rank_hsdp.py). Over 3 training steps of
the critic and the actor (SGD with momentum, whose step shows a gradient off by any factor; AdamW's
would hide it), in float64, the two layouts give the same losses, gradient norms and weights to
rounding; each layout's checkpoint (the trainer's checkpoint manager, DCP) loads into the other
exactly, and the next step from it is the uninterrupted run's. The last test shows the check
catching gradients averaged over the replicas. About 40 s a launch on 2 cores:
`pytest -m slow tests/distributed/test_hsdp.py`.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vapo_lab.distributed.fsdp import mesh_shape
from vapo_lab.distributed.world import World

from .conftest import REPO

SCRIPT = Path(__file__).with_name("rank_hsdp.py")
NODES, PER_NODE = 2, 2


def test_the_mesh_is_one_row_a_node():
    assert mesh_shape(World(0, 8, 0, True)) == (8,)
    # 2 nodes of 4: rank r at row r // 4 (its node), column r % 4
    assert mesh_shape(World(0, 8, 0, True, replicas=2)) == (2, 4)
    assert mesh_shape(World(0, 4, 0, True, replicas=4)) == (4, 1)  # one rank a node: DDP
    with pytest.raises(ValueError, match="4 replicas do not divide 6 ranks"):
        mesh_shape(World(0, 6, 0, True, replicas=4))


def two_nodes(out: Path, folder: Path, *args: str, timeout: int = 300) -> dict:
    """Runs rank_hsdp.py on 2 torchrun agents of 2 ranks each (a static rendezvous on this
    machine, as ``torchrun --nnodes 2 --node-rank K`` on each of two nodes) and returns rank 0's
    results; raises with both agents' output on failure."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES)]
    where = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    script = [str(SCRIPT), str(out), str(folder), *args]
    agents = [
        subprocess.Popen(
            [*run, "--node-rank", str(node), "--nproc-per-node", str(PER_NODE), *where, *script],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        for node in range(NODES)
    ]
    logs = [agent.communicate(timeout=timeout)[0] for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), "\n".join(log[-3000:] for log in logs)
    return torch.load(out, weights_only=True)


def _relative(a: dict, b: dict) -> float:
    """The largest |a − b| / max|a| over the tensors of two dicts (same keys)."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-12)) for k in a)


def _same_metrics(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        # float64: largest relative difference seen 1e-15 (the two reduce in different orders)
        assert b[k] == pytest.approx(v, rel=1e-10, abs=1e-12), k


@pytest.fixture(scope="module")
def summed(tmp_path_factory):
    """rank_hsdp.py's results, gradients summed over every rank as shard() sets them."""
    path = tmp_path_factory.mktemp("hsdp")
    return two_nodes(path / "out.pt", path / "checkpoints")


@pytest.mark.slow
def test_ranks_are_numbered_node_by_node_and_hsdp_shards_within_a_node(summed):
    # two agents of 2: (rank, LOCAL_RANK)
    assert summed["rank"] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    flat, hsdp = summed["layout"]["flat"], summed["layout"]["hsdp"]
    total = flat[0]["total"]
    for rank in range(4):
        assert flat[rank]["mesh"] == (4,) and flat[rank]["placements"] == ["S(0)"]
        assert flat[rank]["groups"] == {"shard": [0, 1, 2, 3]}
        assert hsdp[rank]["mesh"] == (2, 2) and hsdp[rank]["placements"] == ["R", "S(0)"]
        node, local = divmod(rank, 2)
        # the shard group is the rank's node; the replicate group its peer on the other node
        assert hsdp[rank]["groups"] == {
            "replicate": [local, 2 + local],
            "shard": [2 * node, 2 * node + 1],
        }
        # what footprint.shard_ranks counts: a rank holds 1/nproc_per_node of the parameters under
        # hsdp, 1/world flat (this model's 20,256 divide evenly)
        assert hsdp[rank]["local"] == total // 2 and flat[rank]["local"] == total // 4


@pytest.mark.slow
def test_hsdp_trains_as_the_flat_layout(summed):
    losses = summed["losses"]
    assert len(losses["flat"]) == len(losses["hsdp"]) == 3
    for flat, hsdp in zip(losses["flat"], losses["hsdp"]):
        _same_metrics(flat, hsdp)
    # the steps moved: the critic's loss changes from step to step
    assert len({round(m["critic/value_loss"], 6) for m in losses["flat"]}) == 3
    whole = summed["whole"]
    # weights and momentum after 3 steps; largest seen 5.1e-15
    assert _relative(whole["flat"], whole["hsdp"]) < 1e-12
    assert all(float(t.abs().max()) > 0 for k, t in whole["flat"].items() if k.endswith("momentum"))


@pytest.mark.slow
def test_a_checkpoint_loads_across_layouts_and_trains_on_as_uninterrupted(summed):
    whole, losses = summed["whole"], summed["losses"]
    assert summed["flat->hsdp"].endswith("flat/step_000003")
    assert summed["hsdp->flat"].endswith("hsdp/step_000003")
    for saved, into in (("flat", "hsdp"), ("hsdp", "flat")):
        # DCP re-shards: every weight and momentum buffer comes back bit for bit
        loaded = whole[f"{saved}->{into}"]
        assert all(torch.equal(whole[saved][k], loaded[k]) for k in whole[saved])
        _same_metrics(losses[f"{saved} uninterrupted"], losses[f"{saved}->{into}"])


@pytest.mark.slow
def test_the_check_catches_gradients_averaged_over_the_replicas(tmp_path):
    avg = two_nodes(tmp_path / "avg.pt", tmp_path / "checkpoints", "--average-replicas")
    flat, hsdp = avg["losses"]["flat"], avg["losses"]["hsdp"]
    # the first gradients are half the summed ones: their norm halves (seen 102.9 against 205.8)
    assert hsdp[0]["critic/grad_norm"] < 0.6 * flat[0]["critic/grad_norm"]
    with pytest.raises(AssertionError):
        _same_metrics(flat[1], hsdp[1])
    # and the weights end visibly apart (seen 1.4)
    assert _relative(avg["whole"]["flat"], avg["whole"]["hsdp"]) > 1e-2
