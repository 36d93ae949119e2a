"""Where the critic starts: a reward model trained on the base policy's samples, value pretraining.

Both are cached by a hash of everything that determines them (base model, task, reward, critic
and rollout settings) under ``.vapo_cache/``, so every cell of an ablation grid shares one reward
model and one pretrained critic, built once. The package ships those of the embedded default
(``vapo_lab/shipped/``, ``vapo-lab base ship``), found after the folder's own cache: a fresh
folder's first ``vapo-lab train`` starts its policy steps at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from vapo_lab.algo import gae
from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.distributed.world import World, single, world_size
from vapo_lab.integrity import SHIPPED_DIR, find_entry, write_manifest
from vapo_lab.models.sharded import save_sharded_value_model
from vapo_lab.models.value import ValueModel
from vapo_lab.rollout import Generate
from vapo_lab.seeds import rollout_seed
from vapo_lab.trainer.advantages import token_rewards
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import Rows, batched_values, token_micro_batches, value_forward
from vapo_lab.trainer.metrics import critic_metrics

# part of every cache key: bumped whenever the code would build a different reward model or critic
# from the same settings (the sampler's draws, the optimiser's kernel), so old entries are not reused
# 5: packed training passes (models.packed.packed_states) round differently
# 6: GAE's compiled CPU scan (algo.gae_cpu) rounds the critic's targets differently
CACHE_VERSION = 7  # 7: micro-batches of trainer.max_tokens_per_micro_batch tokens (were rows)


def cache_key(*parts: Any) -> str:
    """Returns a 16-hex-digit hash of JSON-serialisable ``parts``."""
    blob = json.dumps([CACHE_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resolved(node: DictConfig) -> Any:
    """Returns ``node`` as plain containers with every interpolation resolved, so that a cache key is
    the same whether the config was just composed (``${rollout.max_new_tokens}``) or read back from a
    run's resolved ``config.yaml`` on resume."""
    return OmegaConf.to_container(node, resolve=True)


def _ranks(cfg: DictConfig) -> list[Any]:
    """The rank count as a key part when the run has more than one (each rank samples its own
    stream, so N ranks build other weights than one process); nothing for one process."""
    n = world_size(cfg) if cfg.trainer.strategy == "fsdp" else 1
    return [["ranks", n]] if n > 1 else []


def reward_model_key(policy_key: str, cfg: DictConfig) -> str:
    """Returns the reward model's cache key: the base policy and every setting that shapes it."""
    return cache_key(
        "rm",
        policy_key,
        _resolved(cfg.task),
        _resolved(cfg.reward),
        float(cfg.rollout.temperature),
        int(cfg.rollout.max_new_tokens),
        cfg.critic.rm_steps,
        cfg.critic.rm_batch,
        int(cfg.trainer.max_tokens_per_micro_batch),
        *_ranks(cfg),
    )


def pretrained_critic_key(critic_key: str, cfg: DictConfig) -> str:
    """Returns the pretrained critic's cache key: where it started and every setting that shapes it."""
    return cache_key(
        "pretrain",
        critic_key,
        _resolved(cfg.task),
        _resolved(cfg.reward),
        _resolved(cfg.critic),
        float(cfg.rollout.temperature),
        float(cfg.rollout.top_p),
        int(cfg.rollout.max_new_tokens),
        int(cfg.rollout.responses_per_step),
        int(cfg.rollout.n_samples),
        float(cfg.trainer.critic_lr),
        int(cfg.trainer.mini_batch_size),
        int(cfg.trainer.max_tokens_per_micro_batch),
        int(cfg.trainer.ppo_epochs),
        float(cfg.gae.gamma),
        *_ranks(cfg),
    )


def critic_start_key(policy_key: str, cfg: DictConfig) -> str:
    """Returns the key of the critic's starting weights (``critic.init``): the reward model's cache key,
    or the policy's key for a critic started from the policy or at random; part of the pretrained
    critic's key."""
    init = cfg.critic.init
    return (
        f"rm:{reward_model_key(policy_key, cfg)}"
        if init == "reward_model"
        else f"{init}:{policy_key}"
    )


def critic_cache_keys(policy_key: str, cfg: DictConfig) -> dict[str, str]:
    """Returns {cache kind: key} of the critic caches a run of ``cfg`` uses, its policy's key being
    ``policy_key``: "reward_model" when the critic starts from it, "pretrained_critic" when value
    pretraining is on (the keys ``init_critic`` looks up; ``vapo-lab base ship`` ships these entries)."""
    keys = {}
    if cfg.critic.init == "reward_model":
        keys["reward_model"] = reward_model_key(policy_key, cfg)
    if cfg.critic.pretrain.enabled:
        keys["pretrained_critic"] = pretrained_critic_key(critic_start_key(policy_key, cfg), cfg)
    return keys


def _cached(
    cache_dir: Path,
    shipped_dir: Path | None,
    kind: str,
    key: str,
    what: str,
    log: Callable[[str], None],
) -> Path | None:
    """Returns the usable entry ``<kind>/<key>``: this folder's cache first, then the package's
    shipped one (``shipped_dir``; the embedded default's are shipped); None: build it. A damaged
    entry is reported in one line (a cached one is then rebuilt)."""
    found = find_entry(
        key, what, cache_dir / kind, shipped_dir / kind if shipped_dir is not None else None, log
    )
    return found[0] if found is not None else None


def _found(
    world: World,
    cache_dir: Path,
    shipped_dir: Path | None,
    kind: str,
    key: str,
    what: str,
    log: Callable[[str], None],
) -> Path | None:
    """``_cached`` as rank 0 sees it, on every rank: the ranks build together or load together."""
    found = _cached(cache_dir, shipped_dir, kind, key, what, log) if world.main else None
    found = world.broadcast(str(found) if found is not None else None)
    return Path(found) if found is not None else None


def _share(items: list[Any], world: World) -> list[Any]:
    """This rank's equal share of ``items`` (every rank draws the same items): all on one process."""
    n = -(-len(items) // world.size)
    return items[world.rank * n : (world.rank + 1) * n]


def _save(model: ValueModel, path: Path, meta: dict[str, Any], world: World) -> None:
    """Writes ``model`` as a cache entry at ``path`` (every rank calls this): rank 0 writes it, a
    sharded model gathered parameter by parameter into rank 0's host memory
    (``models.sharded.save_sharded_value_model``), into a temporary folder renamed into place."""
    tmp = path.with_name(f".tmp-{path.name}-{world.broadcast(os.getpid())}")
    if world.main and tmp.exists():
        shutil.rmtree(tmp)
    if is_sharded(model):
        save_sharded_value_model(model, tmp, world)
    elif world.main:
        model.save(tmp)
    if world.main:
        _commit(tmp, path, meta)
    world.barrier()


def _commit(tmp: Path, path: Path, meta: dict[str, Any]) -> None:
    """Adds ``meta`` and the manifest to the entry written at ``tmp`` and renames it to ``path``."""
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    write_manifest(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def rollout_rows(
    generate: Generate,
    prompts: list[list[int]],
    n: int,
    cfg: DictConfig,
    generator: torch.Generator,
) -> tuple[Rows, Any]:
    """Returns (rows, samples) of n samples per prompt at the training temperature."""
    s = generate(
        prompts, n, float(cfg.rollout.temperature), float(cfg.rollout.top_p), generator
    ).cpu()
    return Rows(s.prompt_ids, s.prompt_mask, s.response_ids, s.response_mask), s


def build_reward_model(
    start: Callable[[], ValueModel],
    generate: Generate,
    policy_key: str,
    cfg: DictConfig,
    draw: Callable[[int], Any],
    score: Callable[[Any, Any], tuple[torch.Tensor, torch.Tensor, list[str]]],
    encode: Callable[[list[Any]], list[list[int]]],
    cache_dir: Path,
    log: Callable[[str], None] = print,
    shipped_dir: Path | None = SHIPPED_DIR,
    world: World | None = None,
) -> Path:
    """Returns the path of an outcome reward model trained on the base policy's own samples.

    The model (policy backbone + scalar head) regresses the verifier's reward at the last response
    token with a squared loss, on ``rm_samples`` fresh samples per round; its output is in reward
    units, so a critic initialised from it predicts the final reward everywhere — right at the end
    of a response, biased before it (the paper's starting point).

    ``start()`` returns the model it trains from: the policy's transformer with a zero head, in
    the compute dtype, sharded on many ranks. There (``world``) every rank samples its share of each
    round's problems from its own stream and each micro-batch step's loss is the mean over all
    ranks' rows; rank 0 writes the result.
    """
    world = world or single()
    opts = cfg.critic
    key = reward_model_key(policy_key, cfg)
    found = _found(world, cache_dir, shipped_dir, "reward_model", key, "reward model", log)
    if found is not None:
        return found
    path = cache_dir / "reward_model" / key
    log(
        f"building the reward model ({opts.rm_steps} steps of {opts.rm_batch} samples of the base policy)"
    )
    gen = torch.Generator().manual_seed(rollout_seed(int(cfg.task.seed), world.rank))
    rm = start()
    opt = torch.optim.AdamW(rm.parameters(), lr=float(cfg.trainer.critic_lr) * 5)
    budget = max(
        1, int(cfg.trainer.max_tokens_per_micro_batch) // world.size
    )  # a step's tokens over the ranks
    history = []
    for step in range(int(opts.rm_steps)):
        problems = _share(draw(int(opts.rm_batch)), world)
        rows, samples = rollout_rows(generate, encode(problems), 1, cfg, gen)
        scores, _, _ = score(samples, problems)
        last = samples.lengths - 1
        rm.train()
        # each micro-batch one optimiser step, in a random order (not sorted by length, as an update's)
        parts: list[Tensor | None] = token_micro_batches(
            torch.randperm(len(problems), generator=gen), rows, budget, by_length=False
        )
        parts += [None] * (
            int(world.max(len(parts))) - len(parts)
        )  # zero-loss passes keep FSDP in step
        for mb in parts:
            if mb is None:
                dummy = value_forward(rm, Rows.dummy(next(rm.parameters()).device))
                loss = dummy.sum() * 0.0
                rows_all = world.sum(0.0)
            else:
                pred = value_forward(rm, rows.take(mb))[torch.arange(len(mb)), last[mb]]
                rows_all = world.sum(float(len(mb)))
                loss = ((pred - scores[mb].to(pred.device)) ** 2).sum() / float(rows_all)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(rm.parameters(), float(cfg.trainer.grad_clip))
            opt.step()
            last_loss = float(world.sum(loss.detach()))  # the mean over all ranks' rows
        history.append(last_loss)
    rm.eval()
    _save(rm, path, {"kind": "reward_model", "loss": history}, world)
    return path


def cached_pretrained_critic(
    critic_key: str,
    cfg: DictConfig,
    cache_dir: Path,
    log_metrics: Callable[[dict[str, float], int], None],
    log: Callable[[str], None] = print,
    shipped_dir: Path | None = SHIPPED_DIR,
    world: World | None = None,
    load: Callable[[Path], ValueModel] = ValueModel.load,
) -> ValueModel | None:
    """Returns the pretrained critic cached for these settings, read by ``load`` (its history sent
    to ``log_metrics`` again), or None: pretrain it."""
    world = world or single()
    found = _found(
        world,
        cache_dir,
        shipped_dir,
        "pretrained_critic",
        pretrained_critic_key(critic_key, cfg),
        "pretrained critic",
        log,
    )
    if found is None:
        return None
    meta = json.loads((found / "meta.json").read_text())
    for i, m in enumerate(meta["history"]):
        log_metrics(m, i)
    return load(found)


def pretrain_critic(
    critic: ValueModel,
    critic_key: str,
    generate: Generate,
    cfg: DictConfig,
    draw: Callable[[int], Any],
    score: Callable[[Any, Any], Any],
    encode: Callable[[list[Any]], list[list[int]]],
    updater_factory: Callable[[ValueModel], Any],
    cache_dir: Path,
    log_metrics: Callable[[dict[str, float], int], None],
    world: World | None = None,
) -> ValueModel:
    """Returns the critic after value pretraining (VAPO §4.1), cached; the history goes to ``log_metrics``.

    The policy is frozen; each step samples a fresh batch from it, computes Monte-Carlo returns
    (GAE with λ = critic.pretrain.lam, 1.0: the return itself) and takes the critic's usual
    mini-batch steps on them. Stops after ``critic.pretrain.steps`` or once explained variance
    reaches ``critic.pretrain.min_explained_variance``. On many ranks (``world``; ``critic``
    sharded, ``updater_factory``'s updater over the same ranks) each rank samples its share of each
    step's problems from its own stream and every statistic is over all ranks; rank 0 writes the
    cache entry (``_save``).
    """
    world = world or single()
    pre = cfg.critic.pretrain
    path = cache_dir / "pretrained_critic" / pretrained_critic_key(critic_key, cfg)
    gen = torch.Generator().manual_seed(rollout_seed(int(cfg.task.seed) + 1, world.rank))
    updater = updater_factory(critic)
    n, budget = int(cfg.rollout.n_samples), int(cfg.trainer.max_tokens_per_micro_batch)
    history: list[dict[str, float]] = []
    for step in range(int(pre.steps)):
        problems = _share(draw(int(cfg.rollout.responses_per_step) // n), world)
        rows, samples = rollout_rows(generate, encode(problems), n, cfg, gen)
        rep = [p for p in problems for _ in range(n)]
        scores, correct, _ = score(samples, rep)
        micros = token_micro_batches(torch.arange(len(rep)), rows, budget)
        extra = int(world.max(len(micros))) - len(micros)  # equal passes on every rank
        values = batched_values(critic, rows, micros, extra)
        rewards = token_rewards(scores, rows.response_mask)
        _, returns = gae(
            rewards, values, rows.response_mask, float(pre.lam), gamma=float(cfg.gae.gamma)
        )
        batch = Batch(
            rows=rows,
            problems=rep,
            scores=scores,
            correct=correct,
            lengths=samples.lengths,
            truncated=samples.truncated,
            old_logprobs=samples.logprobs,
            values=values,
            returns=returns,
        )
        ev = critic_metrics(batch, world)["critic/explained_variance"]
        m = updater.critic_update(batch, step)
        metrics = {
            "pretrain/value_loss": m["critic/value_loss"],
            "pretrain/explained_variance": ev,
            "pretrain/reward": world.mean(scores),
        }
        history.append(metrics)
        log_metrics(metrics, step)
        if pre.min_explained_variance is not None and ev >= float(pre.min_explained_variance):
            break
    _save(
        critic,
        path,
        {"kind": "pretrained_critic", "history": history, "steps": len(history)},
        world,
    )
    return critic
