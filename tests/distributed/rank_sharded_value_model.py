"""Builds value models sharded with ``load_sharded_value_model`` on the ranks torchrun started,
saves them from their shards with ``save_sharded_value_model`` and loads what was saved sharded
again; rank 0 saves what the test compares. Run by tests/distributed/test_sharded_value_model.py:

    # for each pair: the critic from the causal LM's directory, from the value model's, each saved
    # under out_dir, the second save loaded again
    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/distributed/rank_sharded_value_model.py out_dir lm_a vm_a lm_b vm_b
"""

import argparse
import os
from pathlib import Path

import torch

from tests.distributed.ranks import READ, count_reads, leave
from vapo_lab.distributed.fsdp import as_forward, full, is_sharded
from vapo_lab.distributed.world import World
from vapo_lab.models.precision import fsdp_policy
from vapo_lab.models.sharded import load_sharded_value_model, save_sharded_value_model

IDS = torch.tensor([[1, 7, 42, 150, 151, 299, 3, 0], [5, 5, 300, 12, 64, 128, 255, 9]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])  # as the test's

count_reads()  # READ: the elements this rank read from the files (its slices only)


def load(world: World, path, dtype: str, source: str) -> tuple[torch.nn.Module, list[int]]:
    """Returns the critic loaded sharded and the elements each rank read."""
    READ[0] = 0
    critic = load_sharded_value_model(path, world, torch.device("cpu"), dtype, source=source)
    return critic, world.gather(READ[0])


def hidden(critic: torch.nn.Module) -> torch.Tensor:
    """The backbone's last hidden states, as the critic's forward computes them (a zero head's
    values are zero whatever the backbone): run as the critic's forward, so that FSDP2 gathers the
    root."""
    positions = (MASK.cumsum(-1) - 1).clamp(min=0)
    return critic.backbone(
        input_ids=IDS, attention_mask=MASK, position_ids=positions
    ).last_hidden_state


def observe(world: World, critic: torch.nn.Module, read: list[int]) -> dict:
    """Returns what the test compares of a sharded critic: every parameter gathered whole
    (collectives, in the same order on every rank), every rank's buffers and values, the shards'
    dtypes."""
    params = {
        n: full(p.detach()).clone() for n, p in critic.named_parameters(remove_duplicate=False)
    }
    with torch.no_grad():
        values = critic(IDS, MASK)
        states = as_forward(critic, hidden, critic)
    critic.reshard()  # the root stays gathered after its forward (FSDP2's default)
    return {
        "params": params,
        "buffers": world.gather({n: b.clone() for n, b in critic.named_buffers()}),
        "values": world.gather(values),
        "hidden": world.gather(states),
        "read": read,
        "sharded": is_sharded(critic),
        "shard_dtypes": sorted({str(p.dtype) for p in critic.parameters()}),
        "local_dtypes": sorted({str(p.to_local().dtype) for p in critic.parameters()}),
        "head_device": str(critic.head.weight.device),
        "compute": str(fsdp_policy(critic).param_dtype),
        "training": critic.training,
    }


def run(world: World, out: Path, dirs: list[str]) -> None:
    results = {}
    for lm, vm in zip(dirs[::2], dirs[1::2], strict=True):
        name = Path(lm).name
        # (a) from the causal LM's directory, then (c) saved from its shards
        critic, read = load(world, lm, "float32", "causal_lm")
        results[f"{name}/causal_lm"] = observe(world, critic, read)
        save_sharded_value_model(critic, out / f"{name}-from-lm", world)
        # (b) from a ValueModel.save directory, saved, and what was saved loaded sharded again
        critic, read = load(world, vm, "float32", "value_model")
        results[f"{name}/value_model"] = observe(world, critic, read)
        save_sharded_value_model(critic, out / f"{name}-resaved", world)
        # computing in bf16 this time: float32 shards all the same, FSDP2's policy casting the
        # passes
        again, read = load(world, out / f"{name}-resaved", "bfloat16", "value_model")
        results[f"{name}/reloaded"] = observe(world, again, read)
        with torch.no_grad():
            again(IDS, MASK)  # the root left gathered in bf16, as after the trainer's values pass
        save_sharded_value_model(again, out / f"{name}-after-pass", world)
    if world.main:
        torch.save(results, out / "out.pt")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument(
        "dirs", nargs="+", help="pairs: a causal LM's directory, a ValueModel.save directory"
    )
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.distributed.init_process_group("gloo")
    world = World(
        torch.distributed.get_rank(),
        torch.distributed.get_world_size(),
        int(os.environ["LOCAL_RANK"]),
        initialized=True,
    )
    run(world, Path(a.out), a.dirs)
    leave()


if __name__ == "__main__":
    main()
