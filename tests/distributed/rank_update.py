"""One update of the actor and the critic on a fixed global batch, on however many ranks torchrun
started (or one plain process with ``--single``); rank 0 saves the losses, gradients and
parameters to compare. Run by tests/distributed/test_update_equality.py:

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/distributed/rank_update.py vapo out.pt
"""

import argparse
import copy
import os

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.distributed.ranks import leave
from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.distributed.fsdp import full, shard
from vapo_lab.distributed.world import World, init_world, single
from vapo_lab.models.value import ValueModel
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import Rows, batched_logprobs, batched_values, token_micro_batches
from vapo_lab.trainer.update import ActorUpdate, CriticUpdate, Descent

B, N_SAMPLES, VOCAB = 16, 8, 48


def config(preset: str):
    over = [
        "tracking=none",
        f"rollout.responses_per_step={B}",
        "trainer.mini_batch_size=8",
        "trainer.max_tokens_per_micro_batch=40",
        "trainer.grad_clip=1.0e6",
        "trainer.ppo_epochs=2",
        f"rollout.group_size={N_SAMPLES}",
    ]
    if preset == "ppo":
        over.append(f"rollout.n_samples={N_SAMPLES}")
    return typed(compose_config(algo=preset, overrides=over).cfg)


def models():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    policy = Qwen2ForCausalLM(cfg).eval()
    critic = ValueModel.random_like(policy, seed=1).eval()
    # a zero head would zero the backbone's gradient
    torch.nn.init.normal_(critic.head.weight, std=0.5)
    return policy, critic


def global_batch(n: int) -> tuple[Rows, torch.Tensor]:
    """The step's rows: left-padded prompts of 2-5 tokens, right-padded responses of 1-12, and a
    0/1 score per response with both values in every group."""
    g = torch.Generator().manual_seed(5)
    p_len = torch.randint(2, 6, (n,), generator=g)
    r_len = torch.randint(1, 13, (n,), generator=g)
    P, T = int(p_len.max()), int(r_len.max())
    prompt_ids = torch.randint(1, VOCAB, (n, P), generator=g)
    response_ids = torch.randint(1, VOCAB, (n, T), generator=g)
    prompt_mask = torch.arange(P)[None] >= (P - p_len)[:, None]
    response_mask = torch.arange(T)[None] < r_len[:, None]
    prompt_ids[~prompt_mask] = 0
    response_ids[~response_mask] = 0
    scores = (torch.rand(n, generator=g) > 0.5).float()
    scores[::N_SAMPLES], scores[1::N_SAMPLES] = 1.0, 0.0
    return Rows(prompt_ids, prompt_mask, response_ids, response_mask), scores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("out")
    ap.add_argument("--single", action="store_true", help="no FSDP: one plain process")
    ap.add_argument(
        "--average", action="store_true", help="leave FSDP's gradient averaging on (a scale bug)"
    )
    a = ap.parse_args()
    # float64 throughout: the two (packed passes on one process and through FSDP2's hooks) then
    # agree to ~1e-15, where float32 rounding (each rank pads its own rows) gave up to 5e-5 and hid
    # errors
    torch.set_default_dtype(torch.float64)
    cfg = config(a.preset)
    cfg.trainer.strategy = "single" if a.single else "fsdp"
    cfg.trainer.nproc_per_node = int(os.environ.get("WORLD_SIZE", "1"))
    world: World = single() if a.single else init_world(cfg.trainer, torch.device("cpu"))
    policy, critic = models()
    ref = copy.deepcopy(policy) if cfg.kl.coef > 0 else None
    if world.initialized:
        policy, critic = (
            shard(policy, world, torch.device("cpu"), None),
            shard(critic, world, torch.device("cpu"), None),
        )
        ref = shard(ref, world, torch.device("cpu"), None) if ref is not None else None
        if a.average:
            for m in [*policy.modules(), *critic.modules()]:
                if hasattr(m, "set_gradient_divide_factor"):
                    m.set_gradient_divide_factor(float(world.size))
    rows, scores = global_batch(B)
    share = B // world.size
    mine = torch.arange(world.rank * share, (world.rank + 1) * share)
    local = rows.take(mine)
    # keep the global width: rows.take trims to the shard's longest, which is fine for the maths
    micro = token_micro_batches(
        torch.arange(len(mine)), local, cfg.trainer.max_tokens_per_micro_batch
    )
    extra = int(world.max(len(micro))) - len(micro) if world.size > 1 else 0
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
    noise = 0.05 * torch.randn(rows.response_ids.shape, generator=torch.Generator().manual_seed(11))
    batch.old_logprobs = batch.old_logprobs + noise[mine, : batch.old_logprobs.shape[1]]
    if cfg.algo.advantage == "gae":
        batch.values = batched_values(critic, local, micro, extra)
    if ref is not None:
        batch.ref_logprobs = batched_logprobs(ref, local, micro, temperature, extra)
    compute_advantages(cfg.algo, cfg.gae, cfg.kl, cfg.rollout.n_samples, batch, world)

    # SGD, so that scale errors show
    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.05)

    use_critic = cfg.algo.advantage == "gae"
    descent = Descent(cfg.trainer, torch.Generator().manual_seed(3), world)
    metrics = {}
    if use_critic:
        metrics.update(CriticUpdate(descent, cfg.critic, critic, sgd(critic))(batch, 0))
    actor = ActorUpdate(descent, cfg.loss, cfg.kl, temperature, policy, sgd(policy), ref)
    metrics.update(actor(batch, 0))
    adv = world.gather(batch.advantages[batch.rows.response_mask.bool()])
    mask = batch.rows.response_mask.bool()
    out = {
        "metrics": metrics,
        "advantages": torch.cat(adv),
        "old_logprobs": torch.cat(world.gather(batch.old_logprobs[mask])),
        "values": torch.cat(world.gather(batch.values[mask])) if batch.values is not None else None,
        "policy": {k: full(p.detach()).clone() for k, p in policy.named_parameters()},
        "policy_grad": {
            k: full(p.grad).clone() for k, p in policy.named_parameters() if p.grad is not None
        },
    }
    if use_critic:
        out["critic"] = {k: full(p.detach()).clone() for k, p in critic.named_parameters()}
        out["critic_grad"] = {
            k: full(p.grad).clone() for k, p in critic.named_parameters() if p.grad is not None
        }
    if world.main:
        torch.save(out, a.out)
    if world.initialized:
        leave()


if __name__ == "__main__":
    main()
