"""Where the critic starts: a reward model trained on the base policy's samples, then value
pretraining; both cached, and both trained through the phases of a step.

Entries live under ``.vapo_cache/<kind>/<key>/``, keyed by a hash of everything that shapes them,
so every cell of a grid shares one reward model and one pretrained critic, built once. The package
ships the embedded default's (``vapo_lab/shipped/``), looked up after the folder's own cache.
``prepare_caches`` builds a config's entries ahead of its runs (the launchers call it);
``start_critic`` is the trainer's way in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from vapo_lab.config.schema import RM_INITS
from vapo_lab.distributed.fsdp import is_sharded, shard
from vapo_lab.distributed.world import World, world_size
from vapo_lab.integrity import CACHE_DIR, SHIPPED_DIR, find_entry, write_manifest
from vapo_lab.models.packed import enable_checkpointing
from vapo_lab.models.precision import fsdp_policy, set_compute
from vapo_lab.models.sharded import load_sharded_value_model, save_sharded_value_model
from vapo_lab.models.value import ValueModel
from vapo_lab.seeds import (
    pretrain_data_seed,
    pretrain_rollout_seed,
    pretrain_update_seed,
    random_critic_seed,
    reward_model_data_seed,
    reward_model_rollout_seed,
)
from vapo_lab.stop import AttemptClock
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.building import RoundBuild, one_builder
from vapo_lab.trainer.collect import DataStream
from vapo_lab.trainer.forward import Rows, token_micro_batches, value_forward
from vapo_lab.trainer.metrics import critic_metrics
from vapo_lab.trainer.phases import Phases
from vapo_lab.trainer.setup import Parts, build_parts, ready
from vapo_lab.trainer.update import CriticUpdate, Descent, adamw

if TYPE_CHECKING:
    from vapo_lab.config.schema import VapoConfig

# part of every key: bump it when the same settings would build other weights
CACHE_VERSION = 7
# critic.init=reward_model_prefix: the reward model is also taught that every unfinished prefix of
# a response scores 0 (the verifier's verdict on a response cut there), so a critic started from it
# values early tokens low: the bias VC-PPO and VAPO describe (docs/cpu-task-design.md)
PREFIX_RM = RM_INITS[1]

LogMetrics = Callable[[dict[str, float], int], None]


def cache_key(*parts: Any) -> str:
    """Returns a 16-hex-digit hash of JSON-serialisable ``parts``."""
    blob = json.dumps([CACHE_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _ranks(config: VapoConfig) -> list[Any]:
    """The rank count as a key part when the run has more than one (each rank samples its own
    stream, so N ranks build other weights than one process)."""
    n = world_size(config.trainer) if config.trainer.strategy == "fsdp" else 1
    return [["ranks", n]] if n > 1 else []


def reward_model_key(policy_key: str, config: VapoConfig) -> str:
    """Returns the reward model's cache key: the base policy and every setting that shapes it."""
    c, r = config.critic, config.rollout
    return cache_key(
        "rm",
        policy_key,
        dataclasses.asdict(config.task),
        dataclasses.asdict(config.reward),
        r.temperature,
        r.max_new_tokens,
        c.rm_steps,
        c.rm_batch,
        c.rm_tokens_per_step,
        *_ranks(config),
        ["lr", c.rm_lr, "top_p", r.top_p, "grad_clip", config.trainer.grad_clip],
        ["dtype", config.model.dtype],
        *([PREFIX_RM] if c.init == PREFIX_RM else []),  # the default's keys stay as they were
    )


def pretrained_critic_key(critic_key: str, config: VapoConfig) -> str:
    """Returns the pretrained critic's cache key: where it started and every setting that shapes
    it."""
    r, t = config.rollout, config.trainer
    optimiser = [t.adam_betas, t.adam_eps, t.weight_decay, t.adam_impl, t.grad_clip]
    return cache_key(
        "pretrain",
        critic_key,
        dataclasses.asdict(config.task),
        dataclasses.asdict(config.reward),
        _shaping(config.critic),
        r.temperature,
        r.top_p,
        r.max_new_tokens,
        r.responses_per_step,
        r.n_samples,
        t.critic_lr,
        t.mini_batch_size,
        t.max_tokens_per_micro_batch,
        t.ppo_epochs,
        config.gae.gamma,
        *_ranks(config),
        ["optimiser", *optimiser],
        ["dtype", config.model.dtype],
    )


def _shaping(critic: Any) -> dict[str, Any]:
    """The critic settings that shape its weights: all but when its start saves."""
    return {k: v for k, v in dataclasses.asdict(critic).items() if k != "save_every"}


def critic_start_key(policy_key: str, config: VapoConfig) -> str:
    """Returns the key of the critic's starting weights (``critic.init``): the reward model's, or
    the policy's for a critic started from the policy or at random."""
    init = config.critic.init
    if init in RM_INITS:
        return f"rm:{reward_model_key(policy_key, config)}"
    return f"{init}:{policy_key}"


def critic_cache_keys(policy_key: str, config: VapoConfig) -> dict[str, str]:
    """Returns {cache kind: key} of the critic caches a run of ``config`` uses (the ones
    ``vapo-lab base ship`` ships)."""
    keys = {}
    if config.critic.init in RM_INITS:
        keys["reward_model"] = reward_model_key(policy_key, config)
    if config.critic.pretrain.enabled:
        start = critic_start_key(policy_key, config)
        keys["pretrained_critic"] = pretrained_critic_key(start, config)
    return keys


def _found(world: World, kind: str, key: str, what: str, log: Callable[[str], None]) -> Path | None:
    """Returns the usable entry ``<kind>/<key>`` as rank 0 finds it (this folder's cache, then the
    shipped one), on every rank; None: build it. A damaged entry is reported in one line."""
    found = None
    if world.main:
        hit = find_entry(key, what, CACHE_DIR / kind, SHIPPED_DIR / kind, log)
        found = str(hit[0]) if hit is not None else None
    found = world.broadcast(found)
    return Path(found) if found is not None else None


def _save(model: ValueModel, path: Path, meta: dict[str, Any], world: World) -> None:
    """Writes ``model`` as the cache entry ``path`` (every rank calls this): rank 0 writes it into a
    temporary folder renamed into place; a sharded model is gathered parameter by parameter."""
    tmp = path.with_name(f".tmp-{path.name}-{world.broadcast(os.getpid())}")
    if world.main and tmp.exists():
        shutil.rmtree(tmp)
    if is_sharded(model):
        save_sharded_value_model(model, tmp, world)
    elif world.main:
        model.save(tmp)
    if world.main:
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        write_manifest(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    world.barrier()


class CriticStart:
    """Builds the critic a run starts from, out of the run's parts (every rank takes part)."""

    def __init__(
        self,
        config: VapoConfig,
        parts: Parts,
        log_metrics: LogMetrics,
        log: Callable[[str], None],
        clock: AttemptClock | None = None,
    ) -> None:
        self.config, self.parts, self.log_metrics, self.log = config, parts, log_metrics, log
        self.clock = clock or AttemptClock()
        self.phases = Phases(parts, config.trainer, config.rollout.temperature)
        self.sharded = is_sharded(parts.policy)  # built sharded: every critic is too

    def critic(self) -> ValueModel:
        """Returns the critic on this rank's device in eval mode (sharded on many ranks): the
        cached pretrained critic, or one started as ``critic.init`` says and value-pretrained when
        ``critic.pretrain.enabled``, building and caching what is missing."""
        c, p = self.config.critic, self.parts
        if not c.pretrain.enabled:
            return self._started()
        start_key = critic_start_key(p.policy_key, self.config)
        key = pretrained_critic_key(start_key, self.config)
        what = "pretrained critic"
        # the outer lock of two: every job takes this one before the reward model's
        with one_builder(p.world, "pretrained_critic", key, f"the {what} {key}", self.log):
            found = _found(p.world, "pretrained_critic", key, what, self.log)
            if found is not None:
                meta = json.loads((found / "meta.json").read_text())
                for i, m in enumerate(meta["history"]):
                    self.log_metrics(m, i)
                return self._load(found)
            return self._pretrain(self._started(), key)

    def _started(self) -> ValueModel:
        """Returns the critic as ``critic.init`` starts it (the reward model built if need be)."""
        c, p = self.config.critic, self.parts
        if c.init in RM_INITS:
            critic = self._load(self._reward_model())
        elif c.init == "policy":
            critic = self._from_policy()
        else:
            seed = random_critic_seed(self.config.seed)
            critic = self._ready(ValueModel.random_like(p.policy, seed=seed))
        return critic

    def _ready(self, critic: ValueModel) -> ValueModel:
        p = self.parts
        critic = ready(critic, self.config.model, p.device)
        return self._shard(critic)

    def _shard(self, model: nn.Module) -> nn.Module:
        p = self.parts
        return shard(model, p.world, p.device, fsdp_policy(model)) if p.world.initialized else model

    def _read(self, path: Path, source: str) -> ValueModel:
        """A critic built sharded from ``path``: a ``ValueModel.save`` folder or a causal LM's."""
        m, p = self.config.model, self.parts
        critic = load_sharded_value_model(
            path, p.world, p.device, m.dtype, source, m.trust_remote_code
        )
        if m.gradient_checkpointing:
            enable_checkpointing(critic.backbone)
        return critic

    def _load(self, path: Path) -> ValueModel:
        return (
            self._read(path, "value_model") if self.sharded else self._ready(ValueModel.load(path))
        )

    def _from_policy(self) -> ValueModel:
        p = self.parts
        if self.sharded:
            return self._read(p.policy_path, "causal_lm")
        return self._ready(ValueModel.from_causal_lm(p.policy))

    def _reward_model(self) -> Path:
        """Returns the cached outcome reward model's folder, training it first if need be.

        The policy's transformer with a zero head regresses the verifier's reward at the last
        response token (squared error) on ``critic.rm_steps`` rounds of ``critic.rm_batch`` fresh
        samples; a critic started from it predicts the final reward everywhere, right at the end of
        a response and biased before it (the paper's starting point).
        """
        p = self.parts
        key = reward_model_key(p.policy_key, self.config)
        with one_builder(p.world, "reward_model", key, f"the reward model {key}", self.log):
            found = _found(p.world, "reward_model", key, "reward model", self.log)
            return found if found is not None else self._build_reward_model(key)

    def _build_reward_model(self, key: str) -> Path:
        c, p, world = self.config.critic, self.parts, self.parts.world
        self.log(f"building the reward model ({c.rm_steps} steps of {c.rm_batch} samples)")
        data = DataStream(p.task.train, reward_model_data_seed(self.config.task.seed))
        gen = torch.Generator().manual_seed(
            reward_model_rollout_seed(self.config.task.seed, world.rank)
        )
        if self.sharded:
            rm = self._read(p.policy_path, "causal_lm")
        else:
            rm = self._shard(
                set_compute(ValueModel.from_causal_lm(p.policy), self.config.model.dtype)
            )
        optimizer = torch.optim.AdamW(rm.parameters(), lr=c.rm_lr)
        rollout = dataclasses.replace(
            self.config.rollout, responses_per_step=c.rm_batch, n_samples=1
        )
        descent = Descent(self.config.trainer, gen, world)
        budget = max(1, c.rm_tokens_per_step // world.size)  # a step's tokens over the ranks
        build = self._rounds("reward_model", key, rm, optimizer, {"rollout": gen}, data, None)
        for step in build.rounds(c.rm_steps):
            batch, _ = self.phases.rollout(rollout, False, data, gen, p.policy, [rm], [optimizer])
            rm.train()
            # each step a token budget of rows in a random order (not sorted by length)
            order = torch.randperm(len(batch.problems), generator=gen)
            steps: list[Tensor | None] = token_micro_batches(
                order, batch.rows, budget, by_length=False
            )
            steps += [None] * (int(world.max(len(steps))) - len(steps))
            for mb in steps:
                loss = self._regress(rm, optimizer, descent, batch, mb, step)
            build.record(loss)
            self.phases.push(p.policy)
        rm.eval()
        path = CACHE_DIR / "reward_model" / key
        _save(rm, path, {"kind": "reward_model", "loss": build.history}, world)
        build.finish()
        return path

    def _rounds(
        self,
        kind: str,
        key: str,
        model: ValueModel,
        optimizer: torch.optim.Optimizer,
        generators: dict[str, torch.Generator],
        data: DataStream,
        log_metrics: LogMetrics | None,
    ) -> RoundBuild:
        """Returns the build of ``<kind>/<key>``, resumed from its newest save if it has one."""
        every = self.config.critic.save_every
        build = RoundBuild(
            kind,
            key,
            self.parts.world,
            model,
            optimizer,
            generators,
            data,
            every,
            self.clock,
            self.log,
            log_metrics,
        )
        build.resume()
        return build

    def _regress(
        self,
        rm: ValueModel,
        optimizer: torch.optim.Optimizer,
        descent: Descent,
        batch: Any,
        mb: Tensor | None,
        step: int,
    ) -> float:
        """One reward-model optimiser step on rows ``mb`` (None: this rank has none); returns its
        loss, the mean over all ranks' rows."""
        world = self.parts.world
        rows_all = float(world.sum(float(len(mb)) if mb is not None else 0.0))
        last = batch.lengths - 1
        device = next(rm.parameters()).device

        def run_pass(idx: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
            if idx is None:
                return value_forward(rm, Rows.dummy(device)).sum() * 0.0, {}
            rows = batch.rows.take(idx)
            values = value_forward(rm, rows)
            pred = values[torch.arange(len(idx)), last[idx]]
            loss = ((pred - batch.scores[idx].to(pred.device)) ** 2).sum() / rows_all
            if self.config.critic.init == PREFIX_RM:  # each unfinished prefix scores 0, as verified
                prefix = rows.response_mask.to(values.device).clone()
                prefix[torch.arange(len(idx)), last[idx]] = False
                per_row = (values * prefix).pow(2).sum(1) / prefix.sum(1).clamp(min=1)
                loss = loss + per_row.sum() / rows_all
            return loss, {"reward_model/loss": loss.detach()}

        zero = {"reward_model/loss": torch.zeros(())}  # float32: reduced as the loss is
        micros = [mb] if mb is not None else []
        summed, _ = descent.step(rm, optimizer, micros, run_pass, zero, "reward_model/loss", step)
        return summed["reward_model/loss"]

    def _pretrain(self, critic: ValueModel, key: str) -> ValueModel:
        """Returns the critic after value pretraining (VAPO §4.1), cached; its history goes to
        ``log_metrics``.

        The policy is frozen; each step samples a fresh batch from it, computes Monte-Carlo returns
        (critic targets at λ = ``critic.pretrain.lam``, 1.0: the return itself) and takes the
        critic's usual mini-batch steps on them, for ``critic.pretrain.steps`` steps or until
        explained variance reaches ``critic.pretrain.min_explained_variance``.
        """
        cfg, p, world = self.config, self.parts, self.parts.world
        pre = cfg.critic.pretrain
        data = DataStream(p.task.train, pretrain_data_seed(cfg.task.seed))
        gen = torch.Generator().manual_seed(pretrain_rollout_seed(cfg.task.seed, world.rank))
        optimizer = adamw(critic.parameters(), cfg.trainer.critic_lr, cfg.trainer)
        shuffle = torch.Generator().manual_seed(pretrain_update_seed())
        update = CriticUpdate(Descent(cfg.trainer, shuffle, world), cfg.critic, critic, optimizer)
        targets = dataclasses.replace(cfg.gae, lam_critic=pre.lam, lam_critic_mode="decoupled")
        self.log(f"pretraining the critic ({pre.steps} steps of {cfg.rollout.responses_per_step})")
        gens = {"rollout": gen, "shuffle": shuffle}
        build = self._rounds(
            "pretrained_critic", key, critic, optimizer, gens, data, self.log_metrics
        )
        # the round that reaches min_explained_variance breaks before any save: a resumed build
        # never holds it, so it runs on from its save as the uninterrupted one did
        for step in build.rounds(pre.steps):
            batch, _ = self.phases.rollout(
                cfg.rollout, False, data, gen, p.policy, [critic], [optimizer]
            )
            self.phases.model_outputs(batch, critic=critic)
            compute_advantages(cfg.algo, targets, cfg.kl, cfg.rollout.n_samples, batch, world)
            ev = critic_metrics(batch, world)["critic/explained_variance"]
            m = update(batch, step)
            self.phases.push(p.policy)
            metrics = {
                "pretrain/value_loss": m["critic/value_loss"],
                "pretrain/explained_variance": ev,
                "pretrain/reward": world.mean(batch.scores),
            }
            build.record(metrics)
            if pre.min_explained_variance is not None and ev >= pre.min_explained_variance:
                break
        history = build.history
        path = CACHE_DIR / "pretrained_critic" / key
        _save(
            critic,
            path,
            {"kind": "pretrained_critic", "history": history, "steps": len(history)},
            world,
        )
        build.finish()
        return critic


def start_critic(
    config: VapoConfig,
    parts: Parts,
    log_metrics: LogMetrics,
    log: Callable[[str], None],
    clock: AttemptClock | None = None,
) -> ValueModel:
    """Returns the critic a run of ``config`` starts from (``CriticStart.critic``); ``clock``: the
    attempt's measured times, for the stop before the job's time limit."""
    return CriticStart(config, parts, log_metrics, log, clock).critic()


def prepare_caches(config: VapoConfig, log: Callable[[str], None]) -> None:
    """Builds (or finds) every cache a run of ``config`` starts from: the base model, the reward
    model and the pretrained critic. The launchers call it once per distinct config before the
    cells start; its ranks, if any, must be joined as for a run."""
    parts = build_parts(config, log)
    if config.algo.advantage == "gae":
        start_critic(config, parts, lambda metrics, step: None, log)
