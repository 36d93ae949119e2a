"""TRL's side of the benchmark: PPOTrainer and GRPOTrainer on the benchmark's work, as workers.

Runs in a TRL env's interpreter (see :mod:`.envs`). TRL, transformers and datasets are imported
inside the functions: the main env imports this module (the tests of the verifier reward model)
without TRL, and a worker opens its channel before any library can print.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from vapo_lab.bench.trl.envs import TRL_PPO_VERSION, setup_command
from vapo_lab.bench.trl.protocol import Channel, Gate
from vapo_lab.bench.trl.spec import BenchSpec, bench_task


def _trl_setup(spec: BenchSpec) -> Any:
    """Sets threads and seeds in a TRL worker; returns the torch module."""
    import torch

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    return torch


def _trl_common_args(spec: BenchSpec, workdir: str) -> dict[str, Any]:
    """Returns TrainingArguments shared by both TRL trainers: fp32 on CPU, no logging or saving."""
    return dict(
        output_dir=str(Path(workdir) / "trl-out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=spec.seed,
        gradient_checkpointing=False,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        dataloader_num_workers=0,
        max_grad_norm=1.0,
    )


def _verifier_reward_model(tokenizer: Any, task: Any, counter: list[int]) -> Any:
    """Returns the arith verifier shaped as the reward model TRL's PPOTrainer calls.

    PPOTrainer scores a response with ``model.score(getattr(model, model.base_model_prefix)(
    input_ids=..., attention_mask=..., ...).hidden_states[-1])`` read at the last response token.
    Here the "backbone" decodes each row, splits prompt from response at the prompt's closing
    `` =`` token, grades the response text with the task's verifier and writes the 1/0 reward at
    every position; ``score`` is the identity. It also counts the generated tokens into
    ``counter`` (eos included, as on our side). No parameters, no forward pass of a network.
    """
    import torch
    from torch import nn
    from transformers.utils import ModelOutput

    answers = {p.prompt: p for p in task.train}
    eq_id = tokenizer.convert_tokens_to_ids(" =")

    class VerifierBackbone(nn.Module):
        def forward(self, input_ids: Any, attention_mask: Any, **_: Any) -> Any:
            rewards = torch.zeros(input_ids.shape + (1,), dtype=torch.float32)
            for i, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
                ids = [t for t, m in zip(ids, mask) if m]
                cut = ids.index(eq_id) + 1
                problem = answers[tokenizer.decode(ids[:cut], skip_special_tokens=True)]
                text = tokenizer.decode(ids[cut:], skip_special_tokens=True)
                rewards[i] = float(task.verify(text, problem))
                counter[0] += len(ids) - cut
            return ModelOutput(hidden_states=(rewards,))

    class VerifierRewardModel(nn.Module):
        base_model_prefix = "backbone"

        def __init__(self) -> None:
            super().__init__()
            self.backbone = VerifierBackbone()
            self.score = nn.Identity()

    return VerifierRewardModel()


def gc_collect_calls(module: Any) -> int:
    """Returns how many ``gc.collect(`` calls the source of ``module`` has."""
    import inspect

    return inspect.getsource(module).count("gc.collect(")


def disable_gc_collect(module: Any) -> int:
    """Makes ``gc.collect()`` a no-op in ``module`` (a trainer's); returns the calls it has.

    TRL's PPOTrainer runs a full collection twice per step, a large share of its CPU step
    (docs/benchmarks.md#rl-step-against-trl). Only the module's own global ``gc`` is replaced; the
    interpreter's collector and every other module are untouched. The calls are counted in the
    module's source, so that the report can say what was disabled (0: nothing changes).
    """
    import types

    calls = gc_collect_calls(module)
    if calls:
        module.gc = types.SimpleNamespace(collect=lambda *_, **__: 0)
    return calls


def serve_trl_ppo(
    channel: Channel, model_dir: str, spec: BenchSpec, workdir: str, gc_off: bool = False
) -> None:
    """Worker loop of TRL's PPOTrainer (trl==1.12.0) on the benchmark's work.

    ``gc_off``: with the trainer's per-step ``gc.collect()`` calls disabled.
    """
    torch = _trl_setup(spec)
    import trl
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )

    try:
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except ImportError:
        try:
            from trl import PPOConfig, PPOTrainer  # releases before trl.experimental
        except ImportError:
            raise SystemExit(
                f"trl {trl.__version__} in {sys.prefix} has no PPOTrainer (removed in 1.13): "
                f"this env needs trl=={TRL_PPO_VERSION}; recreate it with `{setup_command('ppo')}`"
            ) from None

    module = sys.modules[PPOTrainer.__module__]
    gc_calls = disable_gc_collect(module) if gc_off else gc_collect_calls(module)
    task = bench_task(spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # the value model: the policy's architecture and weights with a scalar head (critic.init=policy)
    value_model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1, dtype=torch.float32
    )
    counter = [0]
    reward_model = _verifier_reward_model(tokenizer, task, counter)
    prompts = [tokenizer(p.prompt)["input_ids"] for p in task.train]
    train = Dataset.from_dict({"input_ids": prompts})
    # a far-off total: the driver stops the worker after the steps it wants
    total_steps = 100_000
    args = PPOConfig(
        **_trl_common_args(spec, workdir),
        # 64 rollouts per step, all generated in one batch; 4 mini-batches of 16, one optimiser step
        # each (per_device_train_batch_size x gradient_accumulation_steps is the rollout batch)
        per_device_train_batch_size=spec.completions,
        gradient_accumulation_steps=1,
        num_mini_batches=spec.completions // spec.mini_batch_size,
        num_ppo_epochs=spec.epochs,
        local_rollout_forward_batch_size=spec.completions,
        total_episodes=spec.completions * total_steps,
        response_length=spec.max_new_tokens,
        temperature=1.0,
        stop_token="eos",
        num_sample_generations=0,
        kl_coef=spec.kl_coef,
        kl_estimator="k1",
        cliprange=0.2,
        cliprange_value=0.5,
        gamma=1.0,
        lam=0.95,
    )
    gate = Gate(
        channel,
        {
            "side": "trl",
            "algo": "ppo",
            "trl": trl.__version__,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "policy_params": sum(p.numel() for p in policy.parameters()),
            "value_params": sum(p.numel() for p in value_model.parameters()),
            "n_samples": 1,
            "reference_model": True,
            "gc_calls": gc_calls,
            "gc_off": gc_off,
            "trainer_module": module.__name__,
        },
    )

    class StepGate(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            gate.begin()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            tokens, counter[0] = counter[0], 0
            gate.end(tokens)

    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=None,
        reward_model=reward_model,
        train_dataset=train,
        value_model=value_model,
        eval_dataset=train.select(range(8)),
        callbacks=[StepGate()],
    )
    trainer.train()


def serve_trl_grpo(
    channel: Channel, model_dir: str, spec: BenchSpec, workdir: str, gc_off: bool = False
) -> None:
    """Worker loop of TRL's GRPOTrainer on the benchmark's work (``gc_off``: as for PPO)."""
    torch = _trl_setup(spec)
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    module = sys.modules[GRPOTrainer.__module__]
    gc_calls = disable_gc_collect(module) if gc_off else gc_collect_calls(module)
    task = bench_task(spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    counter = [0]
    problems = {p.prompt: p for p in task.train}

    def verifier(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        """1/0 from the arith verifier; counts the generated tokens (eos included)."""
        counter[0] += sum(len(ids) for ids in completion_ids)
        return [float(task.verify(c, problems[p])) for p, c in zip(prompts, completions)]

    train = Dataset.from_dict({"prompt": [p.prompt for p in task.train]})
    optimizer_steps = spec.completions // spec.mini_batch_size  # per RL step
    args = GRPOConfig(
        **_trl_common_args(spec, workdir),
        # 64 completions (8 prompts x 8) generated together, then 4 optimiser steps of 16
        per_device_train_batch_size=spec.mini_batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=optimizer_steps,
        num_iterations=spec.epochs,
        num_generations=spec.group_size,
        max_completion_length=spec.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=spec.grpo_beta,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        max_steps=100_000 * optimizer_steps,
        logging_steps=10_000,
    )
    gate = Gate(
        channel,
        {
            "side": "trl",
            "algo": "grpo",
            "trl": trl.__version__,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "policy_params": sum(p.numel() for p in policy.parameters()),
            "n_samples": spec.group_size,
            "reference_model": spec.grpo_beta > 0,
            "gc_calls": gc_calls,
            "gc_off": gc_off,
            "trainer_module": module.__name__,
        },
    )

    class StepGate(TrainerCallback):
        """One RL step = one generation = ``optimizer_steps`` trainer steps."""

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            gate.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **__: Any) -> None:
            if state.global_step % optimizer_steps == 0:
                tokens, counter[0] = counter[0], 0
                gate.end(tokens)

    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[verifier],
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[StepGate()],
    )
    trainer.train()
