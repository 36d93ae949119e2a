"""Training steps of the actor and the critic on 4 ranks started as 2 "nodes" of 2 (two torchrun
agents, so that ranks are numbered node by node as on a cluster), once with each model sharded over
all 4 ranks (trainer.mesh=flat) and once sharded within each node and replicated across the two
(trainer.mesh=hsdp); then each layout's checkpoint, written by the trainer's checkpoint manager
(DCP), loaded into the other layout and trained one step more. Rank 0 saves what
tests/distributed/test_hsdp.py compares. On each of the two "nodes" K = 0, 1:

    python -m torch.distributed.run --nnodes 2 --node-rank K --nproc-per-node 2 \
        --master-addr 127.0.0.1 --master-port P tests/distributed/rank_hsdp.py out.pt ckpt/
"""

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from tests.distributed.rank_update import B, config, global_batch, models
from tests.distributed.ranks import leave
from vapo_lab.distributed.fsdp import full, shard
from vapo_lab.distributed.world import World, init_world
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.checkpointer import CheckpointManager
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import batched_logprobs, batched_values, token_micro_batches
from vapo_lab.trainer.update import ActorUpdate, CriticUpdate, Descent

STEPS = 3  # training steps before the checkpoint; one more after it is loaded
CPU = torch.device("cpu")


def build(world: World, average_replicas: bool = False) -> dict:
    """Returns the seeded actor and critic sharded on ``world``'s mesh, with SGD (momentum: its
    state is checkpointed; SGD's step shows a gradient off by any factor, AdamW's would not)."""
    policy, critic = models()
    policy, critic = shard(policy, world, CPU), shard(critic, world, CPU)
    if average_replicas:  # the bug the test must catch: gradients averaged over the replicas
        for m in [*policy.modules(), *critic.modules()]:
            if hasattr(m, "set_gradient_divide_factor"):
                m.set_gradient_divide_factor(float(world.replicas))
    return {
        "models": {"policy": policy, "critic": critic},
        "optimizers": {
            f"{name}_optimizer": (name, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
            for name, m in (("policy", policy), ("critic", critic))
        },
    }


def train_step(cfg, world: World, parts: dict, step: int) -> dict[str, float]:
    """Returns the metrics of one training step (critic update, then actor update) on the fixed
    global batch, its old log-probs and values from the models as they are now."""
    policy, critic = parts["models"]["policy"], parts["models"]["critic"]
    rows, scores = global_batch(B)
    share = B // world.size
    mine = torch.arange(world.rank * share, (world.rank + 1) * share)
    local = rows.take(mine)
    micro = token_micro_batches(
        torch.arange(len(mine)), local, cfg.trainer.max_tokens_per_micro_batch
    )
    extra = int(world.max(len(micro))) - len(micro)
    temperature = cfg.rollout.temperature
    batch = Batch(
        rows=local,
        problems=[None] * len(mine),
        scores=scores[mine],
        correct=scores[mine] > 0,
        lengths=local.response_mask.sum(-1),
        truncated=torch.zeros(len(mine), dtype=torch.bool),
        old_logprobs=batched_logprobs(policy, local, micro, temperature, extra),
    )
    # an old policy a little off the current one, so that ratios and clipping are not trivial
    noise = 0.05 * torch.randn(
        rows.response_ids.shape, generator=torch.Generator().manual_seed(11 + step)
    )
    batch.old_logprobs = batch.old_logprobs + noise[mine, : batch.old_logprobs.shape[1]]
    batch.values = batched_values(critic, local, micro, extra)
    compute_advantages(cfg.algo, cfg.gae, cfg.kl, cfg.rollout.n_samples, batch, world)
    descent = Descent(cfg.trainer, torch.Generator().manual_seed(3 + step), world)
    _, c_opt = parts["optimizers"]["critic_optimizer"]
    _, p_opt = parts["optimizers"]["policy_optimizer"]
    metrics = CriticUpdate(descent, cfg.critic, critic, c_opt)(batch, step)
    metrics.update(ActorUpdate(descent, cfg.loss, cfg.kl, temperature, policy, p_opt)(batch, step))
    return metrics


def whole(parts: dict) -> dict:
    """Returns every parameter and optimiser state tensor of ``parts``, gathered whole (a
    collective: every rank calls it)."""
    out = {}
    for name, model in parts["models"].items():
        _, opt = parts["optimizers"][f"{name}_optimizer"]
        for key, p in model.named_parameters():
            out[f"{name}.{key}"] = full(p.detach()).clone()
            out[f"{name}.{key}.momentum"] = full(opt.state[p]["momentum_buffer"]).clone()
    return out


def manager(folder: Path, world: World, parts: dict) -> CheckpointManager:
    """Returns the trainer's checkpoint manager over ``parts`` (no scheduler, no per-rank state)."""
    return CheckpointManager(folder, world, parts["models"], parts["optimizers"], {}, {}, print)


def layout(parts: dict) -> dict:
    """Returns how the policy is laid out on this rank: its mesh's shape, the ranks of each of its
    groups, its parameters' placements and how many elements this rank holds."""
    p = next(parts["models"]["policy"].parameters())
    mesh = p.device_mesh
    groups = {}
    for dim, name in enumerate(mesh.mesh_dim_names or ("shard",)):
        groups[name] = torch.distributed.get_process_group_ranks(mesh.get_group(dim))
    model = parts["models"]["policy"]
    return {
        "mesh": tuple(mesh.shape),
        "groups": groups,
        "placements": [str(x) for x in p.placements],
        "local": sum(q.to_local().numel() for q in model.parameters()),
        "total": sum(q.numel() for q in model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("folder")
    ap.add_argument(
        "--average-replicas",
        action="store_true",
        help="average gradients over the HSDP replicas instead of summing them (a scale bug)",
    )
    a = ap.parse_args()
    # float64: the two layouts reduce in different orders; in float64 they agree to ~1e-15
    torch.set_default_dtype(torch.float64)
    cfg = config("vapo")
    cfg.trainer.strategy, cfg.trainer.nodes, cfg.trainer.nproc_per_node = "fsdp", 2, 2
    cfg.trainer.mesh = "hsdp"
    # clipping bites on some optimiser steps (the critic's first gradients' norms are near 100) and
    # not on others, so that both the norm over the mesh and a gradient's scale show
    cfg.trainer.grad_clip = 40.0
    hsdp = init_world(cfg.trainer, CPU)
    worlds = {"flat": dataclasses.replace(hsdp, replicas=1), "hsdp": hsdp}
    folder = Path(a.folder)
    out: dict = {"rank": [], "layout": {}, "losses": {}, "whole": {}, "seconds": {}}
    trained = {}
    for name, world in worlds.items():
        parts = build(world, a.average_replicas and name == "hsdp")
        out["layout"][name] = world.gather(layout(parts))
        start = time.perf_counter()
        out["losses"][name] = [train_step(cfg, world, parts, s) for s in range(STEPS)]
        out["seconds"][name] = time.perf_counter() - start
        out["whole"][name] = whole(parts)
        if not a.average_replicas:
            manager(folder / name, world, parts).save(STEPS)
        trained[name] = parts
    if a.average_replicas:
        return save(out, hsdp, a.out)
    # each checkpoint into fresh models of the other layout, trained one step more; and the
    # uninterrupted models' own next step, to compare with
    for saved, into in (("flat", "hsdp"), ("hsdp", "flat")):
        parts = build(worlds[into])
        out[f"{saved}->{into}"] = str(manager(folder / saved, worlds[into], parts).load())
        out["whole"][f"{saved}->{into}"] = whole(parts)
        out["losses"][f"{saved}->{into}"] = train_step(cfg, worlds[into], parts, STEPS)
    for name, world in worlds.items():
        out["losses"][f"{name} uninterrupted"] = train_step(cfg, world, trained[name], STEPS)
    save(out, hsdp, a.out)


def save(out: dict, world: World, path: str) -> None:
    """Saves ``out`` with each rank's (rank, local rank) on rank 0, then ends the rank."""
    out["rank"] = world.gather((world.rank, world.local_rank))
    if world.main:
        torch.save(out, path)
    leave()


if __name__ == "__main__":
    main()
