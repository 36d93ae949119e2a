"""The named pieces a training run is set up from, in the order ``Trainer`` calls them.

Process settings (threads, device, deterministic kernels, the rollout backend's requirements),
seeds, the task, the policy (the embedded base model built on first use, or a local checkpoint)
with a check that prompts plus responses fit its context, how it is sampled, and where the
critic starts (reward model, the policy, or random; then value pretraining).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils import deterministic as torch_deterministic

from vapo_lab.basemodel.build import ProgressFactory, build_base_for
from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.distributed.world import World, single
from vapo_lab.errors import ConfigError
from vapo_lab.integrity import CACHE_DIR
from vapo_lab.models.load import pick_device
from vapo_lab.models.packed import enable_checkpointing
from vapo_lab.models.precision import set_compute
from vapo_lab.models.sharded import load_sharded_value_model
from vapo_lab.models.value import ValueModel
from vapo_lab.rollout import make_engine, make_generator
from vapo_lab.rollout.prompts import encode_prompts
from vapo_lab.tasks import build_task
from vapo_lab.trainer.collect import DataStream, Sampling
from vapo_lab.trainer.critic_init import (
    build_reward_model,
    cached_pretrained_critic,
    critic_start_key,
    pretrain_critic,
)
from vapo_lab.trainer.scoring import RewardScorer
from vapo_lab.trainer.update import Updater, adamw


def prepare_process(cfg: DictConfig) -> torch.device:
    """Applies the process-wide settings of ``cfg`` and returns the training device.

    Raises:
        ConfigError: the device is not available.
        BackendUnavailable: rollout.backend=vllm without vLLM or a GPU (before any compute).
    """
    if cfg.trainer.threads:
        torch.set_num_threads(int(cfg.trainer.threads))
    device = pick_device(cfg.trainer.device)
    if device.type == "cpu":
        # some CPU backward kernels accumulate in an order that varies run to run; this picks
        # their deterministic versions (conf/trainer/default.yaml: deterministic)
        torch.use_deterministic_algorithms(bool(cfg.trainer.deterministic), warn_only=True)
        # the mode also fills every new tensor with NaN by default (to expose reads of
        # uninitialised memory): a memory pass per op output that buys no determinism here
        torch_deterministic.fill_uninitialized_memory = False
    if cfg.rollout.backend == "vllm":
        from vapo_lab.rollout.vllm_backend import require_vllm

        require_vllm()
    return device


def seed_everything(cfg: DictConfig) -> None:
    """Seeds Python's and torch's global RNGs with ``seed``."""
    random.seed(int(cfg.seed))
    torch.manual_seed(int(cfg.seed))


def task_for(cfg: DictConfig) -> Any:
    """Returns the task ``cfg.task`` describes (its splits drawn with ``task.seed``)."""
    c = cfg.task
    kw: dict[str, Any] = {
        "seed": int(c.seed),
        "n_train": int(c.n_train),
        "n_eval": int(c.n_eval),
        **dict(c.options),
    }
    if c.name != "arith":
        kw.update(
            train_path=c.train_path,
            eval_path=c.eval_path,
            problem_key=c.problem_key,
            answer_key=c.answer_key,
            prompt_template=c.prompt_template,
        )
    return build_task(c.name, **kw)


def longest_prompt(cfg: DictConfig, task: Any, tokenizer: Any) -> tuple[int, Any]:
    """Returns (the token count of the longest prompt over the train and eval splits, its problem),
    encoded as the trainer encodes prompts: the prompt budget of a response's context."""
    problems = list(task.train) + list(task.eval)
    lengths = [len(ids) for ids in encode_prompts(tokenizer, problems, cfg.model.chat_template)]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    return lengths[longest], problems[longest]


def check_context(cfg: DictConfig, task: Any, tokenizer: Any, context: int | None) -> None:
    """Raises ConfigError when the longest prompt plus ``rollout.max_new_tokens`` exceeds the model's
    context of ``context`` tokens (None: unknown, not checked), naming the problem and both fixes."""
    new = int(cfg.rollout.max_new_tokens)  # >= 1: checked at compose time
    if context is None:
        return
    tokens, problem = longest_prompt(cfg, task, tokenizer)
    if tokens + new > context:
        raise ConfigError(
            f"the longest prompt ({tokens} tokens, problem {problem.id}) plus "
            f"rollout.max_new_tokens={new} exceeds the model's context of {context} tokens: lower "
            "rollout.max_new_tokens, drop long problems, or use a model with a longer context"
            + (" (model.arch.max_position_embeddings)" if cfg.model.name == "tiny" else "")
        )


def load_policy(
    cfg: DictConfig,
    log: Callable[[str], None],
    progress: ProgressFactory | None,
    world: World | None = None,
    device: torch.device | None = None,
    sharded: bool = False,
) -> tuple[Any, Any, str, Path]:
    """Returns (policy, tokenizer, a cache key of the initial weights, its directory); model=tiny
    builds the base model first if it is not cached (``progress``: its progress bar), on rank 0
    of ``world`` while the others wait. ``sharded``: the policy is built already sharded over
    ``world`` on ``device`` (``models.sharded``; every rank takes part)."""
    from vapo_lab.models.load import load_model_and_tokenizer, load_tokenizer

    world = world or single()
    with world.main_first():  # rank 0 builds the base model on first use, the others then find it
        if cfg.model.name == "tiny":
            base = build_base_for(cfg, progress, log=log)
            if not base.cached:
                log(
                    f"built the base model in {base.metrics.get('build_seconds', 0):.0f}s: {base.path}"
                )
            path, key = base.path, base.path.name
        else:
            path = Path(cfg.model.path)
            key = str(path.resolve())
    if sharded:
        from vapo_lab.models.sharded import load_sharded_causal_lm

        policy = load_sharded_causal_lm(
            path, world, device, cfg.model.dtype, cfg.model.trust_remote_code
        )
        return (
            policy,
            load_tokenizer(cfg.model.tokenizer_path or path, cfg.model.trust_remote_code),
            key,
            path,
        )
    # float32 master weights, computing in model.dtype (models.precision)
    policy, tokenizer = load_model_and_tokenizer(
        path,
        dtype="float32",
        tokenizer_path=cfg.model.tokenizer_path,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    return set_compute(policy, cfg.model.dtype), tokenizer, key, path


def builds_sharded(cfg: DictConfig, world: World) -> bool:
    """Returns True when the policy (and reference) are built already sharded (``models.sharded``):
    on many ranks with vLLM sampling (the built-in sampler keeps a whole copy to sample from)."""
    return world.initialized and cfg.rollout.backend == "vllm"


def checked_policy(
    cfg: DictConfig,
    task: Any,
    device: torch.device,
    log: Callable[[str], None],
    progress: ProgressFactory | None,
    world: World | None = None,
) -> tuple[Any, Any, str, Path]:
    """Returns ``load_policy``'s (policy, tokenizer, key, path), the policy on ``device`` in eval mode
    (checkpointed in training as ``model.gradient_checkpointing`` says), after checking that the
    task's prompts fit its context: for model=tiny before the base build (the tokenizer is the
    task's vocabulary), for a checkpoint once it is loaded. Built sharded over ``world`` where
    ``builds_sharded`` says so."""
    if cfg.model.name == "tiny":
        from vapo_lab.models.tokenizer import build_tokenizer

        check_context(
            cfg,
            task,
            build_tokenizer(task.vocabulary()),
            int(cfg.model.arch.max_position_embeddings),
        )
    world = world or single()
    policy, tokenizer, key, path = load_policy(
        cfg, log, progress, world, device, builds_sharded(cfg, world)
    )
    if cfg.model.name != "tiny":
        check_context(cfg, task, tokenizer, getattr(policy.config, "max_position_embeddings", None))
    if cfg.model.gradient_checkpointing:
        enable_checkpointing(policy)
    policy.to(device).eval()
    return policy, tokenizer, key, path


def make_sampling(
    cfg: DictConfig, policy: Any, tokenizer: Any, policy_path: Path, task: Any
) -> Sampling:
    """Returns how the run samples ``policy``: the backend's generate function and its engine (vLLM
    loads its own copy from ``policy_path``, with a context of ``task``'s longest prompt plus
    ``rollout.max_new_tokens``), the prompt encoding and the padding id."""
    eos_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
    engine = None
    if cfg.rollout.backend == "vllm":
        engine = make_engine(
            cfg.rollout.backend, policy_path, cfg, longest_prompt(cfg, task, tokenizer)[0]
        )
    generate = make_generator(
        cfg.rollout.backend, policy, int(cfg.rollout.max_new_tokens), eos_ids, pad_id, engine
    )
    return Sampling(
        generate,
        lambda problems: encode_prompts(tokenizer, problems, cfg.model.chat_template),
        pad_id,
        engine,
    )


def init_critic(
    cfg: DictConfig,
    policy: Any,
    policy_key: str,
    task: Any,
    sampling: Sampling,
    score: RewardScorer,
    device: torch.device,
    log_metrics: Callable[[dict[str, float], int], None],
    log: Callable[[str], None],
    world: World | None = None,
    shard: Callable[[nn.Module], nn.Module] | None = None,
    policy_path: Path | None = None,
) -> ValueModel:
    """Returns the critic on ``device`` in eval mode: from the reward model (built and cached on first
    use), the policy or random weights (``critic.init``), then value-pretrained when
    ``critic.pretrain.enabled`` (cached too; its metrics go to ``log_metrics``).

    On many ranks every rank takes part in building the reward model and in value pretraining, each
    model sharded by ``shard``; the critic returned is sharded. Where the policy was built sharded
    (``builds_sharded``) every critic is too, read from its files by each rank's share
    (``models.sharded``: the reward model and ``critic.init=policy`` start from the checkpoint at
    ``policy_path``); a random critic is drawn whole on each rank, then sharded.
    """
    world = world or single()
    sharded = is_sharded(policy)

    def ready(critic: ValueModel) -> ValueModel:
        critic = _ready(critic, cfg, device)
        return shard(critic) if world.initialized and shard is not None else critic

    def read(path: Path, source: str) -> ValueModel:
        """A critic built sharded from ``path``, a ``ValueModel.save`` folder or a causal LM's."""
        critic = load_sharded_value_model(
            path, world, device, cfg.model.dtype, source, cfg.model.trust_remote_code
        )
        if cfg.model.gradient_checkpointing:
            enable_checkpointing(critic.backbone)
        return critic

    def load(path: Path) -> ValueModel:
        return read(path, "value_model") if sharded else ready(ValueModel.load(path))

    def rm_start() -> ValueModel:
        if sharded:
            return read(policy_path, "causal_lm")
        rm = set_compute(ValueModel.from_causal_lm(policy), cfg.model.dtype)
        return shard(rm) if world.initialized and shard is not None else rm

    critic_key = critic_start_key(policy_key, cfg)
    if cfg.critic.pretrain.enabled:
        found = cached_pretrained_critic(
            critic_key, cfg, CACHE_DIR, log_metrics, log, world=world, load=load
        )
        if found is not None:
            return found
    init = cfg.critic.init
    if init == "reward_model":
        draw_rng = DataStream(task.train, int(cfg.task.seed) + 99)
        critic = load(
            build_reward_model(
                rm_start,
                sampling.generate,
                policy_key,
                cfg,
                draw_rng.take,
                score,
                sampling.encode,
                CACHE_DIR,
                log=log,
                world=world,
            )
        )
    elif init == "policy":
        critic = (
            read(policy_path, "causal_lm") if sharded else ready(ValueModel.from_causal_lm(policy))
        )
    else:
        critic = ready(ValueModel.random_like(policy, seed=int(cfg.seed)))
    if cfg.critic.pretrain.enabled:

        def updater_factory(c: ValueModel) -> Updater:
            opt = adamw(c.parameters(), float(cfg.trainer.critic_lr), cfg.trainer)
            return Updater(cfg, policy, c, None, None, opt, torch.Generator().manual_seed(3), world)

        critic = pretrain_critic(
            critic,
            critic_key,
            sampling.generate,
            cfg,
            DataStream(task.train, int(cfg.task.seed) + 5).take,
            score,
            sampling.encode,
            updater_factory,
            CACHE_DIR,
            log_metrics,
            world=world,
        )
    return critic


def _ready(critic: ValueModel, cfg: DictConfig, device: torch.device) -> ValueModel:
    """Returns ``critic`` on ``device`` in eval mode, its backbone checkpointed in training as
    ``model.gradient_checkpointing`` says (a critic loaded from a cache comes without the setting)."""
    if cfg.model.gradient_checkpointing:
        enable_checkpointing(critic.backbone)
    return set_compute(critic.to(device), cfg.model.dtype).eval()
