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
from torch import nn

from vapo_lab.algo import explained_variance, gae
from vapo_lab.integrity import SHIPPED_DIR, find_entry, write_manifest
from vapo_lab.models.precision import set_compute
from vapo_lab.models.value import ValueModel
from vapo_lab.rollout import Generate
from vapo_lab.trainer.advantages import token_rewards
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import Rows, batched_values, value_forward

# part of every cache key: bumped whenever the code would build a different reward model or critic
# from the same settings (the sampler's draws, the optimiser's kernel), so old entries are not reused
# 5: packed training passes (models.packed.packed_states) round differently
CACHE_VERSION = 6  # 6: GAE's compiled CPU scan (algo.gae_cpu) rounds the critic's targets differently


def cache_key(*parts: Any) -> str:
    """Returns a 16-hex-digit hash of JSON-serialisable ``parts``."""
    blob = json.dumps([CACHE_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resolved(node: DictConfig) -> Any:
    """Returns ``node`` as plain containers with every interpolation resolved, so that a cache key is
    the same whether the config was just composed (``${rollout.max_new_tokens}``) or read back from a
    run's resolved ``config.yaml`` on resume."""
    return OmegaConf.to_container(node, resolve=True)


def reward_model_key(policy_key: str, cfg: DictConfig) -> str:
    """Returns the reward model's cache key: the base policy and every setting that shapes it."""
    return cache_key("rm", policy_key, _resolved(cfg.task), _resolved(cfg.reward), float(cfg.rollout.temperature),
                     int(cfg.rollout.max_new_tokens), cfg.critic.rm_steps, cfg.critic.rm_batch)


def pretrained_critic_key(critic_key: str, cfg: DictConfig) -> str:
    """Returns the pretrained critic's cache key: where it started and every setting that shapes it."""
    return cache_key("pretrain", critic_key, _resolved(cfg.task), _resolved(cfg.reward),
                     _resolved(cfg.critic), float(cfg.rollout.temperature), float(cfg.rollout.top_p),
                     int(cfg.rollout.max_new_tokens), int(cfg.rollout.responses_per_step),
                     int(cfg.rollout.n_samples), float(cfg.trainer.critic_lr), int(cfg.trainer.mini_batch_size),
                     int(cfg.trainer.micro_batch_size), int(cfg.trainer.ppo_epochs), float(cfg.gae.gamma))


def critic_start_key(policy_key: str, cfg: DictConfig) -> str:
    """Returns the key of the critic's starting weights (``critic.init``): the reward model's cache key,
    or the policy's key for a critic started from the policy or at random; part of the pretrained
    critic's key."""
    init = cfg.critic.init
    return f"rm:{reward_model_key(policy_key, cfg)}" if init == "reward_model" else f"{init}:{policy_key}"


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


def _cached(cache_dir: Path, shipped_dir: Path | None, kind: str, key: str, what: str,
            log: Callable[[str], None]) -> Path | None:
    """Returns the usable entry ``<kind>/<key>``: this folder's cache first, then the package's
    shipped one (``shipped_dir``; the embedded default's are shipped); None: build it. A damaged
    entry is reported in one line (a cached one is then rebuilt)."""
    found = find_entry(key, what, cache_dir / kind, shipped_dir / kind if shipped_dir is not None else None, log)
    return found[0] if found is not None else None


def _atomic_save(model: ValueModel, path: Path, meta: dict[str, Any]) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save(tmp)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    write_manifest(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def rollout_rows(generate: Generate, prompts: list[list[int]], n: int, cfg: DictConfig,
                 generator: torch.Generator) -> tuple[Rows, Any]:
    """Returns (rows, samples) of n samples per prompt at the training temperature."""
    s = generate(prompts, n, float(cfg.rollout.temperature), float(cfg.rollout.top_p), generator).cpu()
    return Rows(s.prompt_ids, s.prompt_mask, s.response_ids, s.response_mask), s


def build_reward_model(policy: nn.Module, generate: Generate, policy_key: str, cfg: DictConfig,
                       draw: Callable[[int], Any],
                       score: Callable[[Any, Any], tuple[torch.Tensor, torch.Tensor, list[str]]],
                       encode: Callable[[list[Any]], list[list[int]]], cache_dir: Path,
                       log: Callable[[str], None] = print, shipped_dir: Path | None = SHIPPED_DIR) -> Path:
    """Returns the path of an outcome reward model trained on the base policy's own samples.

    The model (policy backbone + scalar head) regresses the verifier's reward at the last response
    token with a squared loss, on ``rm_samples`` fresh samples per round; its output is in reward
    units, so a critic initialised from it predicts the final reward everywhere — right at the end
    of a response, biased before it (the paper's starting point).
    """
    opts = cfg.critic
    key = reward_model_key(policy_key, cfg)
    found = _cached(cache_dir, shipped_dir, "reward_model", key, "reward model", log)
    if found is not None:
        return found
    path = cache_dir / "reward_model" / key
    log(f"building the reward model ({opts.rm_steps} steps of {opts.rm_batch} samples of the base policy)")
    gen = torch.Generator().manual_seed(int(cfg.task.seed))
    rm = set_compute(ValueModel.from_causal_lm(policy), cfg.model.dtype)
    opt = torch.optim.AdamW(rm.parameters(), lr=float(cfg.trainer.critic_lr) * 5)
    history = []
    for step in range(int(opts.rm_steps)):
        problems = draw(int(opts.rm_batch))
        rows, samples = rollout_rows(generate, encode(problems), 1, cfg, gen)
        scores, _, _ = score(samples, problems)
        last = samples.lengths - 1
        rm.train()
        for mb in torch.randperm(len(problems), generator=gen).split(int(cfg.trainer.micro_batch_size)):
            r = rows.take(mb)
            pred = value_forward(rm, r)[torch.arange(len(mb)), last[mb]]
            loss = ((pred - scores[mb].to(pred.device)) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(rm.parameters(), float(cfg.trainer.grad_clip))
            opt.step()
        history.append(float(loss.detach()))
    rm.eval()
    _atomic_save(rm, path, {"kind": "reward_model", "loss": history})
    return path


def pretrain_critic(critic: ValueModel, critic_key: str, generate: Generate, cfg: DictConfig,
                    draw: Callable[[int], Any], score: Callable[[Any, Any], Any],
                    encode: Callable[[list[Any]], list[list[int]]], updater_factory: Callable[[ValueModel], Any], cache_dir: Path,
                    log_metrics: Callable[[dict[str, float], int], None],
                    log: Callable[[str], None] = print, shipped_dir: Path | None = SHIPPED_DIR) -> ValueModel:
    """Returns the critic after value pretraining (VAPO §4.1); the history goes to ``log_metrics``.

    The policy is frozen; each step samples a fresh batch from it, computes Monte-Carlo returns
    (GAE with λ = critic.pretrain.lam, 1.0: the return itself) and takes the critic's usual
    mini-batch steps on them. Stops after ``critic.pretrain.steps`` or once explained variance
    reaches ``critic.pretrain.min_explained_variance``. Cached: a grid pretrains once.
    """
    pre = cfg.critic.pretrain
    key = pretrained_critic_key(critic_key, cfg)
    found = _cached(cache_dir, shipped_dir, "pretrained_critic", key, "pretrained critic", log)
    if found is not None:
        meta = json.loads((found / "meta.json").read_text())
        for i, m in enumerate(meta["history"]):
            log_metrics(m, i)
        return ValueModel.load(found)
    path = cache_dir / "pretrained_critic" / key
    gen = torch.Generator().manual_seed(int(cfg.task.seed) + 1)
    updater = updater_factory(critic)
    n = int(cfg.rollout.n_samples)
    history: list[dict[str, float]] = []
    for step in range(int(pre.steps)):
        problems = draw(int(cfg.rollout.responses_per_step) // n)
        rows, samples = rollout_rows(generate, encode(problems), n, cfg, gen)
        rep = [p for p in problems for _ in range(n)]
        scores, correct, _ = score(samples, rep)
        values = batched_values(critic, rows, int(cfg.trainer.micro_batch_size))
        rewards = token_rewards(scores, rows.response_mask)
        _, returns = gae(rewards, values, rows.response_mask, float(pre.lam), gamma=float(cfg.gae.gamma))
        ev = float(explained_variance(values, returns, rows.response_mask))
        batch = Batch(rows=rows, problems=rep, scores=scores, correct=correct, lengths=samples.lengths,
                      truncated=samples.truncated, old_logprobs=samples.logprobs, values=values, returns=returns)
        m = updater.critic_update(batch, step)
        metrics = {"pretrain/value_loss": m["critic/value_loss"], "pretrain/explained_variance": ev,
                   "pretrain/reward": float(scores.mean())}
        history.append(metrics)
        log_metrics(metrics, step)
        if pre.min_explained_variance is not None and ev >= float(pre.min_explained_variance):
            break
    meta = {"kind": "pretrained_critic", "history": history, "steps": len(history)}
    _atomic_save(critic, path, meta)
    return critic

