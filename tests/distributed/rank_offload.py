"""A tiny model and its AdamW, trained two steps, then sent to the host and back
(:mod:`vapo_lab.distributed.offload`) and trained on beside a twin that never left; for each of
torch's AdamW kernels. Imported by tests/distributed/test_offload.py for one process, and run by it
on 2 ranks (FSDP2 over gloo), each rank writing its checks to ``<out>/rank<r>.json``:

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/distributed/rank_offload.py out
"""

import argparse
import copy
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from tests.distributed.ranks import leave
from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.distributed.offload import to_device, to_host
from vapo_lab.trainer.update import adamw

IMPLS = ("fused", "foreach", "for-loop")


class Tiny(nn.Module):
    """Two layers and a head of 3 rows (unevenly sharded over 2 ranks), plus a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 6), nn.Linear(6, 6)])
        self.head = nn.Linear(6, 3)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x) * self.scale


def optimizer(model: nn.Module, impl: str) -> torch.optim.AdamW:
    """The trainer's AdamW (``vapo_lab.trainer.update.adamw``) with kernel ``impl``."""
    t = OmegaConf.create(
        {"adam_impl": impl, "adam_betas": [0.9, 0.999], "adam_eps": 1e-8, "weight_decay": 0.01}
    )
    return adamw(model.parameters(), 1e-2, t)


def train(
    model: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int, device: torch.device
) -> None:
    """``steps`` AdamW steps on seeded inputs; the gradients of the last stay on the parameters."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=g).to(device)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()


def local(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def tensors(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    """Returns this rank's part of every parameter, gradient and optimiser state tensor, by name."""
    out = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = local(p)
        if p.grad is not None:
            out[f"grad/{name}"] = local(p.grad)
        for key, value in opt.state[p].items():
            if isinstance(value, Tensor):
                out[f"state/{name}/{key}"] = local(value)
    return out


def fsdp_storage_follows(model: nn.Module) -> bool:
    """True when every FSDP2 parameter's own storage reference (``FSDPParam._sharded_param_data``,
    what the next all-gather reads) is the storage of the parameter's local shard."""
    from torch.distributed.fsdp import FSDPModule

    fsdp_params = [
        fp
        for m in model.modules()
        if isinstance(m, FSDPModule)
        for group in m._get_fsdp_state()._fsdp_param_groups
        for fp in group.fsdp_params
    ]
    return bool(fsdp_params) and all(
        fp._sharded_param_data.untyped_storage().data_ptr()
        == fp.sharded_param.to_local().untyped_storage().data_ptr()
        for fp in fsdp_params
    )


def roundtrip(make, impl: str, device: torch.device) -> dict[str, bool]:
    """Returns the checks of one offload and reload of ``make()`` (trained 2 steps with AdamW
    ``impl``), and of 2 more steps against a twin that stayed put."""
    model, twin = make()
    opt, twin_opt = optimizer(model, impl), optimizer(twin, impl)
    train(model, opt, 2, seed=1, device=device)
    train(twin, twin_opt, 2, seed=1, device=device)
    before = tensors(model, opt)
    saved = {k: t.detach().clone() for k, t in before.items()}
    where = {k: (t.data_ptr(), t.device) for k, t in before.items()}
    # foreach and for-loop AdamW keep `step` on the CPU by design; only the fused kernel's moves
    stays = {k for k in before if k.endswith("/step") and impl != "fused"}
    kinds = {k.split("/")[0] if not k.startswith("state/") else k.rsplit("/", 1)[1] for k in before}
    c: dict[str, bool] = {
        "has grads and AdamW state": {"param", "grad", "exp_avg", "exp_avg_sq", "step"} <= kinds
    }

    kept = {k: before[k] for k in stays}
    moved_bytes = sum(t.numel() * t.element_size() for k, t in before.items() if k not in stays)
    del before  # the test's own references would keep the old optimiser state alive
    allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0

    off = to_host([model], [opt])
    if device.type == "cuda":
        c["device memory released"] = allocated - torch.cuda.memory_allocated(device) >= moved_bytes
    host = tensors(model, opt)
    c["same names on the host"] = host.keys() == saved.keys()
    moved = [k for k in host if k not in stays]
    c["every tensor in new host storage"] = all(
        host[k].device.type == "cpu" and host[k].data_ptr() != where[k][0] for k in moved
    )
    c["CPU steps left where they were"] = all(host[k] is kept[k] for k in stays)
    c["equal on the host"] = all(torch.equal(host[k], saved[k].cpu()) for k in host)
    if device.type == "cuda":
        c["pinned"] = all(host[k].is_pinned() for k in moved)  # one process: no FSDP2 re-padding
    c["buffers on the host"] = all(b.device.type == "cpu" for b in model.buffers())
    c["fsdp storage follows (host)"] = not is_sharded(model) or fsdp_storage_follows(model)

    to_device(off)
    back = tensors(model, opt)
    c["back where they were, bit-equal"] = back.keys() == saved.keys() and all(
        back[k].device == where[k][1] and torch.equal(back[k], saved[k]) for k in back
    )
    c["fsdp storage follows (device)"] = not is_sharded(model) or fsdp_storage_follows(model)

    # 2 steps: the second one's forward reads what the first wrote into the moved storage
    train(model, opt, 2, seed=2, device=device)
    train(twin, twin_opt, 2, seed=2, device=device)
    a, b = tensors(model, opt), tensors(twin, twin_opt)
    c["next steps bit-identical to the twin"] = a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) for k in a
    )
    c["the steps changed the parameters"] = any(
        not torch.equal(a[k], saved[k]) for k in a if k.startswith("param/")
    )
    return c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    a = ap.parse_args()
    from vapo_lab.distributed.fsdp import shard
    from vapo_lab.distributed.world import World

    torch.distributed.init_process_group("gloo")
    world = World(
        rank=torch.distributed.get_rank(), size=torch.distributed.get_world_size(), initialized=True
    )
    cpu = torch.device("cpu")

    def make() -> tuple[nn.Module, nn.Module]:
        torch.manual_seed(0)
        model = Tiny()
        twin = copy.deepcopy(model)
        return shard(model, world, cpu), shard(twin, world, cpu)

    checks = {impl: roundtrip(make, impl, cpu) for impl in IMPLS}
    (Path(a.out) / f"rank{world.rank}.json").write_text(json.dumps(checks))
    leave()


if __name__ == "__main__":
    main()
