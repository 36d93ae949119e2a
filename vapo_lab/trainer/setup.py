"""The parts a run is built from, each from the config sections it needs.

``build_parts`` assembles them in order: process settings, ranks, seeds, the task, the policy
(the embedded base model built on first use, or a local checkpoint) checked against its context,
how it is sampled and how samples are scored. The trainer and the cache builder share them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils import deterministic as torch_deterministic

from vapo_lab.basemodel.build import ProgressFactory, build_base_for
from vapo_lab.distributed.world import World, init_world
from vapo_lab.errors import ConfigError
from vapo_lab.integrity import CACHE_DIR
from vapo_lab.models.load import pick_device
from vapo_lab.models.packed import enable_checkpointing
from vapo_lab.models.precision import set_compute
from vapo_lab.rollout import make_engine, make_generator
from vapo_lab.rollout.prompts import encode_prompts
from vapo_lab.rollout.sampler import sampling_dtype
from vapo_lab.tasks import build_task
from vapo_lab.trainer.collect import Sampling
from vapo_lab.trainer.scoring import RewardScorer

if TYPE_CHECKING:
    from vapo_lab.config.schema import (
        ModelConfig,
        RolloutConfig,
        TaskConfig,
        TrainerConfig,
        VapoConfig,
    )


@dataclass
class Parts:
    """What a run samples and scores with, on this rank.

    Attributes:
        policy: the initial policy, whole (sharded only where vLLM samples on many ranks).
        policy_key: the cache key of its initial weights; ``policy_path`` their folder.
    """

    device: torch.device
    world: World
    task: Any
    policy: nn.Module
    tokenizer: Any
    policy_key: str
    policy_path: Path
    sampling: Sampling
    scorer: RewardScorer


def build_parts(
    config: VapoConfig, log: Callable[[str], None], progress: ProgressFactory | None = None
) -> Parts:
    """Returns the parts of a run of ``config`` on this process (joining its ranks)."""
    device = prepare_process(config.trainer, config.rollout.backend)
    world = init_world(config.trainer, device)
    # before any load or engine build: ranks on other nodes read what rank 0 writes in both
    runs = Path(config.resume) if config.resume else Path(config.output_dir)
    world.require_shared({"the run folder": runs, "the shared caches": CACHE_DIR})
    seed_everything(config.seed)
    task = task_for(config.task)
    sharded = builds_sharded(config.rollout.backend, world)
    policy, tokenizer, key, path = checked_policy(
        config, task, device, log, progress, world, sharded
    )
    sampling = make_sampling(
        config.rollout, config.model, config.seed, policy, tokenizer, path, task
    )
    for note in getattr(sampling.engine, "notes", ()):  # what the vLLM platform skipped
        log(note)
    scorer = RewardScorer(task, tokenizer, config.reward)
    return Parts(device, world, task, policy, tokenizer, key, path, sampling, scorer)


def prepare_process(trainer: TrainerConfig, backend: str) -> torch.device:
    """Applies the process-wide settings and returns the training device.

    Raises:
        ConfigError: the device is not available.
        BackendUnavailable: rollout.backend=vllm without vLLM or a GPU (before any compute).
    """
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    device = pick_device(trainer.device)
    if device.type == "cpu":
        # some CPU backward kernels accumulate in an order that varies run to run
        torch.use_deterministic_algorithms(trainer.deterministic, warn_only=True)
        # the mode also NaN-fills every new tensor: a memory pass per op that buys nothing here
        torch_deterministic.fill_uninitialized_memory = False
    if backend == "vllm":
        from vapo_lab.rollout.vllm_backend import require_vllm

        require_vllm()
    return device


def seed_everything(seed: int) -> None:
    """Seeds Python's and torch's global RNGs."""
    random.seed(seed)
    torch.manual_seed(seed)


def task_for(task: TaskConfig) -> Any:
    """Returns the task the section describes (its splits drawn with ``task.seed``)."""
    kw: dict[str, Any] = {
        "seed": task.seed,
        "n_train": task.n_train,
        "n_eval": task.n_eval,
        **task.options,
    }
    if task.name != "arith":
        kw.update(
            train_path=task.train_path,
            eval_path=task.eval_path,
            problem_key=task.problem_key,
            answer_key=task.answer_key,
            prompt_template=task.prompt_template,
        )
    return build_task(task.name, **kw)


def longest_prompt(task: Any, tokenizer: Any, chat_template: str) -> tuple[int, Any]:
    """Returns (the token count of the longest prompt of both splits, its problem): the prompt
    budget of a response's context."""
    problems = list(task.train) + list(task.eval)
    lengths = [len(ids) for ids in encode_prompts(tokenizer, problems, chat_template)]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    return lengths[longest], problems[longest]


def check_context(
    model: ModelConfig, max_new_tokens: int, task: Any, tokenizer: Any, context: int | None
) -> None:
    """Raises ConfigError when the longest prompt plus ``max_new_tokens`` exceeds the model's
    context of ``context`` tokens (None: unknown, not checked), naming the problem and the fixes."""
    if context is None:
        return
    tokens, problem = longest_prompt(task, tokenizer, model.chat_template)
    if tokens + max_new_tokens > context:
        raise ConfigError(
            f"the longest prompt ({tokens} tokens, problem {problem.id}) plus "
            f"rollout.max_new_tokens={max_new_tokens} exceeds the model's context of {context} "
            "tokens: lower rollout.max_new_tokens, drop long problems, or use a model with a "
            "longer "
            "context" + (" (model.arch.max_position_embeddings)" if model.name == "tiny" else "")
        )


def load_policy(
    model: ModelConfig,
    task: TaskConfig,
    log: Callable[[str], None],
    progress: ProgressFactory | None,
    world: World,
    device: torch.device | None = None,
    sharded: bool = False,
    threads: int | None = None,
) -> tuple[Any, Any, str, Path]:
    """Returns (policy, tokenizer, the cache key of the initial weights, their folder).

    model=tiny builds the base model first if it is not cached (on rank 0 while the others wait).
    ``sharded``: the policy is built already sharded over ``world`` on ``device``.
    """
    from vapo_lab.models.load import load_model_and_tokenizer, load_tokenizer

    with world.main_first():
        if model.name == "tiny":
            base = build_base_for(model, task, progress, log=log, threads=threads)
            if not base.cached:
                seconds = base.metrics.get("build_seconds", 0)
                log(f"built the base model in {seconds:.0f}s: {base.path}")
            path, key = base.path, base.path.name
        else:
            path = Path(model.path)
            key = str(path.resolve())
    if sharded:
        from vapo_lab.models.sharded import load_sharded_causal_lm

        policy = load_sharded_causal_lm(path, world, device, model.dtype, model.trust_remote_code)
        tokenizer = load_tokenizer(model.tokenizer_path or path, model.trust_remote_code)
        return policy, tokenizer, key, path
    # float32 master weights, computing in model.dtype (models.precision)
    policy, tokenizer = load_model_and_tokenizer(
        path,
        dtype="float32",
        tokenizer_path=model.tokenizer_path,
        trust_remote_code=model.trust_remote_code,
    )
    return set_compute(policy, model.dtype), tokenizer, key, path


def builds_sharded(backend: str, world: World) -> bool:
    """True when the policy and reference are built already sharded: many ranks sampling with vLLM
    (the built-in sampler keeps a whole copy to sample from)."""
    return world.initialized and backend == "vllm"


def checked_policy(
    config: VapoConfig,
    task: Any,
    device: torch.device,
    log: Callable[[str], None],
    progress: ProgressFactory | None,
    world: World,
    sharded: bool,
) -> tuple[Any, Any, str, Path]:
    """Returns ``load_policy``'s four, the policy on ``device`` in eval mode, after checking that
    the prompts fit its context: for model=tiny before the base build (its tokenizer is the task's
    vocabulary), for a checkpoint once it is loaded."""
    model, new = config.model, config.rollout.max_new_tokens
    if model.name == "tiny":
        from vapo_lab.models.tokenizer import build_tokenizer

        tokenizer = build_tokenizer(task.vocabulary())
        check_context(model, new, task, tokenizer, model.arch.max_position_embeddings)
    policy, tokenizer, key, path = load_policy(
        model, config.task, log, progress, world, device, sharded, config.trainer.threads
    )
    if model.name != "tiny":
        context = getattr(policy.config, "max_position_embeddings", None)
        check_context(model, new, task, tokenizer, context)
    if model.gradient_checkpointing:
        enable_checkpointing(policy)
    policy.to(device).eval()
    return policy, tokenizer, key, path


def make_sampling(
    rollout: RolloutConfig,
    model: ModelConfig,
    seed: int,
    policy: Any,
    tokenizer: Any,
    policy_path: Path,
    task: Any,
) -> Sampling:
    """Returns how the run samples ``policy``: the backend's generate function and its engine (vLLM
    loads its own copy from ``policy_path``, its context the longest prompt plus
    ``rollout.max_new_tokens``), the prompt encoding and the padding id."""
    eos_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
    engine = None
    if rollout.backend == "vllm":
        context = longest_prompt(task, tokenizer, model.chat_template)[0] + rollout.max_new_tokens
        engine = make_engine(policy_path, rollout.vllm, model, seed, context)
        engine.push_weights(policy)  # the engine's own weights are dummies until this push
    generate = make_generator(
        rollout.backend,
        policy,
        rollout.max_new_tokens,
        eos_ids,
        pad_id,
        engine,
        graphs=rollout.cuda_graphs,
    )

    def encode(problems: list[Any]) -> list[list[int]]:
        return encode_prompts(tokenizer, problems, model.chat_template)

    param = next(policy.parameters())
    builtin_dtype = sampling_dtype(param.device, param.dtype)
    recompute = rollout.backend == "builtin" and builtin_dtype != param.dtype
    return Sampling(generate, encode, pad_id, engine, recompute)


def ready(critic: nn.Module, model: ModelConfig, device: torch.device) -> nn.Module:
    """Returns ``critic`` on ``device`` in eval mode, computing in ``model.dtype``, its backbone
    checkpointed in training as ``model.gradient_checkpointing`` says (a cached critic comes
    without the setting)."""
    if model.gradient_checkpointing:
        enable_checkpointing(critic.backbone)
    return set_compute(critic.to(device), model.dtype).eval()
