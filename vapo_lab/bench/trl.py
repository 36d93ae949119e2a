"""Benchmark of one RL step through vapo-lab's trainer and through TRL, on CPU, interleaved.

``vapo-lab bench trl`` (or ``python -m vapo_lab.bench.trl``) times the same work on both sides:
a ~1.1M-parameter Qwen2 policy (``build_tiny_model`` with the embedded tokenizer, random init,
saved with ``save_pretrained`` so that every side loads the very same weights), fp32, 2 torch
threads, 64 completions of at most 32 new tokens per step, sampling at temperature 1 with stop at
end-of-sequence, one PPO epoch of 4 optimiser steps on mini-batches of 16, and a rule-based
reward: the arith task's verifier (10-digit additions, so every prompt has 22 tokens).

  (a) vapo-lab PPO and VAPO against TRL's ``PPOTrainer`` (removed in TRL 1.13: run from
      ``trl==1.12.0`` in its own virtual env). PPOTrainer takes the reward model and the value
      model as modules: the verifier is wrapped as a "reward model" (:func:`_verifier_reward_model`)
      and the value model is a Qwen2 of the policy's size with a scalar head, started from the
      policy's weights, like vapo-lab's ``critic.init=policy``.
  (b) vapo-lab GRPO against TRL's current ``GRPOTrainer`` (8 prompts x 8 samples), reward
      function = the verifier, in a second env (``trl==1.16.0``, the latest release when this was
      written; it cannot share the 1.12 env).

Every side is a persistent worker process driven over a pipe (JSON lines): our side runs
``vapo_lab.trainer.run.Run.train_step`` — the trainer's own step: sampler, grader, critic values,
GAE / group advantages, critic and actor updates with their optimisers — on a ``Run`` built from
a composed config; a TRL side runs ``trainer.train()`` and a callback stops it at every step
boundary until the driver says go. The driver interleaves steps of all sides (rotating the
order every round), so machine drift hits them alike. The TRL workers run in the TRL envs'
interpreters, executed by path; they import nothing of vapo-lab but the task module (stdlib only),
loaded from this source tree without installing vapo-lab there.

Setup of the TRL envs (once; about a minute from the local torch wheel and PyPI)::

    vapo-lab bench trl --setup

which runs, for each env (``.bench-venv/trl112`` with trl==1.12.0, ``.bench-venv/trl-latest``
with trl==1.16.0)::

    python -m venv .bench-venv/trl112
    .bench-venv/trl112/bin/pip install torch==2.13.0
    .bench-venv/trl112/bin/pip install trl==1.12.0

Where the two sides' work differs, the printout says so (:func:`format_trl_benchmark`).

Read the load average it prints: with other processes on the cores, a 2-thread step waits for
descheduled threads at every parallel region, and the side with more small ops (TRL's PPOTrainer
above all) slows down most — measured on a 2-core machine at load 4-6, TRL PPO steps took 9-54 s
at 2 threads against a steady 2.8-3.1 s at 1 thread. ``--threads 1`` gives stable ratios there.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    from vapo_lab.errors import VapoLabError
except ImportError:  # run by path in a TRL env, where vapo-lab is not installed
    VapoLabError = Exception  # type: ignore[misc,assignment]


class TrlBenchError(VapoLabError):
    """A TRL env is missing or a benchmark worker failed; the message is one line with the fix."""


# TRL releases, each in its own env: PPOTrainer was removed in 1.13.
TRL_PPO_VERSION = "1.12.0"
TRL_GRPO_VERSION = "1.16.0"
# the torch of the main env, a CPU wheel on local disk (a bare `torch` would pull a CUDA build)
TORCH_PIN = "2.13.0"
ENV_ROOT = Path(".bench-venv")
ENVS = {"ppo": ("trl112", TRL_PPO_VERSION), "grpo": ("trl-latest", TRL_GRPO_VERSION)}
# driver-side wait for one worker message (setup or a block of steps) before giving up
MESSAGE_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class BenchSpec:
    """The work of one step, the same on every side.

    Attributes:
        completions: responses per step (B).
        max_new_tokens: response length cap; generation also stops at end-of-sequence.
        group_size: samples per prompt for VAPO and GRPO (G); PPO samples each prompt once.
        mini_batch_size: responses per optimiser step (4 optimiser steps per epoch at B = 64).
        epochs: PPO epochs over each step's responses.
        threads: torch intra-op threads of every worker.
        digits: digits of each number in the arith prompts (a prompt is 2·digits + 2 tokens).
        n_problems: size of the training split the prompts are drawn from.
        seed: model init, task split, sampling and shuffling seed.
        kl_coef: TRL PPOTrainer's default KL penalty in the reward (k1), also given to our PPO.
        grpo_beta: GRPO's KL coefficient in the loss (k3), vapo-lab's preset value, given to TRL.
        lr: actor learning rate (1e-4, the CPU preset's); the value model uses 2e-4 on our side.
    """

    completions: int = 64
    max_new_tokens: int = 32
    group_size: int = 8
    mini_batch_size: int = 16
    epochs: int = 1
    threads: int = 2
    digits: int = 10
    n_problems: int = 1024
    seed: int = 0
    kl_coef: float = 0.05
    grpo_beta: float = 0.04
    lr: float = 1e-4


# -------------------------------------------------------------------------------------------------
# The shared model and task


def _import_arith() -> Any:
    """Returns the ``vapo_lab.tasks.arith`` module, in a TRL env too (stdlib-only imports).

    In the main env vapo-lab is installed; in a TRL env it is not, so the package is loaded from
    this source tree by file location, without putting the tree (or the main env) on sys.path.
    """
    if "vapo_lab" not in sys.modules:
        try:
            import vapo_lab  # noqa: F401
        except ImportError:
            import importlib.util

            package_dir = Path(__file__).resolve().parents[1]
            spec = importlib.util.spec_from_file_location(
                "vapo_lab", package_dir / "__init__.py", submodule_search_locations=[str(package_dir)])
            module = importlib.util.module_from_spec(spec)
            sys.modules["vapo_lab"] = module
            spec.loader.exec_module(module)
    import vapo_lab.tasks.arith as arith

    return arith


def bench_task(spec: BenchSpec) -> Any:
    """Returns the arith task whose train split every side draws its prompts from."""
    arith = _import_arith()
    return arith.ArithTask(seed=spec.seed, n_train=spec.n_problems, n_eval=8,
                           min_digits=spec.digits, max_digits=spec.digits, length_exponent=0.0)


def build_bench_model(path: str | Path, seed: int = 0) -> int:
    """Saves the tiny policy and its tokenizer to ``path``; returns the policy's parameter count.

    The tokenizer covers the embedded task's whole vocabulary (1..40 digits, 2827 tokens), as the
    default model's does, so the model has the default size (~1.1M parameters) whatever
    ``BenchSpec.digits`` is.
    """
    from vapo_lab.models.tiny import build_tiny_model
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks.arith import ArithTask

    tokenizer = build_tokenizer(ArithTask(seed=0, n_train=0, n_eval=0).vocabulary())
    model = build_tiny_model(tokenizer, seed=seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


# -------------------------------------------------------------------------------------------------
# Workers: the protocol


class _Channel:
    """A worker's end of the pipe: JSON lines in on stdin, out on the original stdout.

    The original stdout is kept for the protocol and fd 1 is pointed at stderr, so prints and
    progress output of the libraries cannot corrupt the messages.
    """

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **message: Any) -> None:
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()

    def recv(self) -> dict[str, Any]:
        line = sys.stdin.readline()
        if not line:  # the driver is gone
            os._exit(0)
        return json.loads(line)


def _peak_rss_mib() -> float:
    """Returns this process's peak resident set size in MiB (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Gate:
    """Counts steps for the driver: runs ``n`` steps per ``run`` command, then reports and waits.

    ``begin`` is called before the first step, ``end(tokens)`` after each; the time of a step is
    from the previous ``end`` (or the go) to this one, so everything a trainer does between two
    steps is counted.
    """

    def __init__(self, channel: _Channel, info: dict[str, Any]) -> None:
        self.channel, self.info = channel, info
        self.remaining = 0
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.t0 = 0.0

    def begin(self) -> None:
        self.channel.send(event="ready", rss_mib=_peak_rss_mib(), **self.info)
        self._wait()

    def end(self, tokens: int) -> None:
        now = time.perf_counter()
        self.times.append(now - self.t0)
        self.tokens.append(int(tokens))
        self.remaining -= 1
        if self.remaining <= 0:
            self.channel.send(event="done", seconds=self.times, tokens=self.tokens, rss_mib=_peak_rss_mib())
            self.times, self.tokens = [], []
            self._wait()
        else:
            self.t0 = time.perf_counter()

    def _wait(self) -> None:
        command = self.channel.recv()
        if command.get("cmd") != "run":
            os._exit(0)
        self.remaining = int(command["steps"])
        self.t0 = time.perf_counter()


# -------------------------------------------------------------------------------------------------
# Our side


def our_overrides(algo: str, model_dir: str | Path, spec: BenchSpec, output_dir: str | Path) -> list[str]:
    """Returns the Hydra overrides that give the trainer the benchmark's work for ``algo``.

    The algorithm's own preset is kept (``--algo ppo|vapo|grpo``) with these changes: the model is
    the benchmark's checkpoint, the critic starts from the policy (TRL's value model does too) with
    no value pretraining (a one-off phase before step 1, not part of a step), no tracking, and
    PPO gets TRL PPOTrainer's default KL penalty in the reward (k1, 0.05), so that both run a
    reference model.
    """
    out = [
        "model=hf", f"model.path={model_dir}", "model.dtype=float32", "model.chat_template=none",
        "trainer.device=cpu", f"trainer.threads={spec.threads}", f"seed={spec.seed}",
        f"task.seed={spec.seed}", f"task.n_train={spec.n_problems}", "task.n_eval=8",
        f"task.options.min_digits={spec.digits}", f"task.options.max_digits={spec.digits}",
        "task.options.length_exponent=0.0",
        f"rollout.responses_per_step={spec.completions}", f"rollout.max_new_tokens={spec.max_new_tokens}",
        f"rollout.group_size={spec.group_size}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        f"trainer.ppo_epochs={spec.epochs}", f"trainer.mini_batch_size={spec.mini_batch_size}",
        f"trainer.micro_batch_size={spec.mini_batch_size}", f"trainer.actor_lr={spec.lr}",
        f"trainer.critic_lr={2 * spec.lr}", "trainer.warmup_steps=0",
        "tracking=none", f"output_dir={output_dir}", "critic.init=policy", "reward.overlong.l_cache=8",
    ]
    if algo == "vapo":
        out.append("value_pretraining=off")
    if algo == "ppo":
        out += [f"kl.coef={spec.kl_coef}", "kl.estimator=k1", "kl.target=reward"]
    if algo == "grpo":
        out += [f"kl.coef={spec.grpo_beta}", "kl.estimator=k3", "kl.target=loss"]
    return out


def bench_config(algo: str, model_dir: str | Path, spec: BenchSpec, output_dir: str | Path) -> Any:
    """Returns the composed config (``Composed``) of our side of the benchmark.

    Composed without the whole-config check: the benchmark's untrained policy writes at most
    ``spec.max_new_tokens`` (32) tokens while a correct 10-digit arith response needs 33, which that
    check refuses for training. The benchmark times a step's work, not learning, and TRL gets the
    very same cap.
    """
    from vapo_lab.config.compose import compose_config

    return compose_config(algo=algo, overrides=our_overrides(algo, model_dir, spec, output_dir), check=False)


class OurWorker:
    """vapo-lab's trainer on the benchmark's work: ``step()`` is one ``Run.train_step``."""

    def __init__(self, algo: str, model_dir: str | Path, spec: BenchSpec, output_dir: str | Path) -> None:
        import torch

        from vapo_lab.trainer.run import Run

        composed = bench_config(algo, model_dir, spec, output_dir)
        self.cfg = composed.cfg
        self.run = Run(composed.cfg, composed.choices, progress=False,
                       log=lambda text: print(text, file=sys.stderr), command="vapo-lab bench trl")
        self.info = {"side": "vapo-lab", "algo": algo, "torch": torch.__version__,
                     "threads": torch.get_num_threads(),
                     "policy_params": sum(p.numel() for p in self.run.policy.parameters()),
                     "n_samples": int(self.cfg.rollout.n_samples),
                     "reference_model": self.run.ref is not None}

    def step(self) -> tuple[float, int, dict[str, float]]:
        """Returns (seconds, generated tokens, metrics) of one trainer step."""
        t0 = time.perf_counter()
        metrics = self.run.train_step()
        seconds = time.perf_counter() - t0
        self.run.step += 1
        tokens = round(metrics["rollout/response_length"] * metrics["rollout/responses"])
        return seconds, tokens, metrics


def _serve_ours(algo: str, model_dir: str, spec: BenchSpec, workdir: str) -> None:
    channel = _Channel()
    worker = OurWorker(algo, model_dir, spec, workdir)
    gate = _Gate(channel, worker.info)
    gate.begin()
    while True:
        gate.t0 = time.perf_counter()  # time only the trainer's step, not the pipe
        _, tokens, _ = worker.step()
        gate.end(tokens)


# -------------------------------------------------------------------------------------------------
# TRL side (runs in a TRL env's interpreter)


def _trl_setup(spec: BenchSpec) -> Any:
    """Sets threads and seeds in a TRL worker; returns the torch module."""
    import torch

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    return torch


def _trl_common_args(spec: BenchSpec, workdir: str) -> dict[str, Any]:
    """Returns TrainingArguments shared by both TRL trainers: fp32 on CPU, no logging or saving."""
    return dict(output_dir=str(Path(workdir) / "trl-out"), use_cpu=True, bf16=False, fp16=False,
                report_to="none", save_strategy="no", disable_tqdm=True, seed=spec.seed,
                gradient_checkpointing=False,
                learning_rate=spec.lr, lr_scheduler_type="constant", warmup_steps=0,
                dataloader_num_workers=0, max_grad_norm=1.0)


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


def _serve_trl_ppo(model_dir: str, spec: BenchSpec, workdir: str) -> None:
    channel = _Channel()
    torch = _trl_setup(spec)
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    try:
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except ImportError:
        try:
            from trl import PPOConfig, PPOTrainer  # releases before trl.experimental
        except ImportError:
            raise SystemExit(f"trl {trl.__version__} in {sys.prefix} has no PPOTrainer (removed in 1.13): "
                             f"this env needs trl=={TRL_PPO_VERSION}; recreate it with `{setup_command('ppo')}`"
                             ) from None

    task = bench_task(spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # the value model: the policy's architecture and weights with a scalar head (critic.init=policy)
    value_model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
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
        per_device_train_batch_size=spec.completions, gradient_accumulation_steps=1,
        num_mini_batches=spec.completions // spec.mini_batch_size, num_ppo_epochs=spec.epochs,
        local_rollout_forward_batch_size=spec.completions,
        total_episodes=spec.completions * total_steps, response_length=spec.max_new_tokens,
        temperature=1.0, stop_token="eos", num_sample_generations=0, kl_coef=spec.kl_coef,
        kl_estimator="k1", cliprange=0.2, cliprange_value=0.5, gamma=1.0, lam=0.95,
    )
    gate = _Gate(channel, {"side": "trl", "algo": "ppo", "trl": trl.__version__, "torch": torch.__version__,
                           "threads": torch.get_num_threads(),
                           "policy_params": sum(p.numel() for p in policy.parameters()),
                           "value_params": sum(p.numel() for p in value_model.parameters()),
                           "n_samples": 1, "reference_model": True})

    class StepGate(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            gate.begin()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            tokens, counter[0] = counter[0], 0
            gate.end(tokens)

    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=None,
                         reward_model=reward_model, train_dataset=train, value_model=value_model,
                         eval_dataset=train.select(range(8)), callbacks=[StepGate()])
    trainer.train()


def _serve_trl_grpo(model_dir: str, spec: BenchSpec, workdir: str) -> None:
    channel = _Channel()
    torch = _trl_setup(spec)
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = bench_task(spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    counter = [0]
    problems = {p.prompt: p for p in task.train}

    def verifier(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                 **_: Any) -> list[float]:
        """1/0 from the arith verifier; counts the generated tokens (eos included)."""
        counter[0] += sum(len(ids) for ids in completion_ids)
        return [float(task.verify(c, problems[p])) for p, c in zip(prompts, completions)]

    train = Dataset.from_dict({"prompt": [p.prompt for p in task.train]})
    optimizer_steps = spec.completions // spec.mini_batch_size  # per RL step
    args = GRPOConfig(
        **_trl_common_args(spec, workdir),
        # 64 completions (8 prompts x 8) generated together, then 4 optimiser steps of 16
        per_device_train_batch_size=spec.mini_batch_size, gradient_accumulation_steps=1,
        steps_per_generation=optimizer_steps, num_iterations=spec.epochs,
        num_generations=spec.group_size, max_completion_length=spec.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=spec.grpo_beta, epsilon=0.2, loss_type="grpo",
        scale_rewards="group", max_steps=100_000 * optimizer_steps, logging_steps=10_000,
    )
    gate = _Gate(channel, {"side": "trl", "algo": "grpo", "trl": trl.__version__, "torch": torch.__version__,
                           "threads": torch.get_num_threads(),
                           "policy_params": sum(p.numel() for p in policy.parameters()),
                           "n_samples": spec.group_size, "reference_model": spec.grpo_beta > 0})

    class StepGate(TrainerCallback):
        """One RL step = one generation = ``optimizer_steps`` trainer steps."""

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            gate.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **__: Any) -> None:
            if state.global_step % optimizer_steps == 0:
                tokens, counter[0] = counter[0], 0
                gate.end(tokens)

    trainer = GRPOTrainer(model=policy, reward_funcs=[verifier], args=args, train_dataset=train,
                          processing_class=tokenizer, callbacks=[StepGate()])
    trainer.train()


# -------------------------------------------------------------------------------------------------
# The driver


def setup_command(part: str) -> str:
    """Returns the shell commands that create the TRL env for ``part`` (ppo or grpo)."""
    name, version = ENVS[part]
    env = ENV_ROOT / name
    return (f"python -m venv {env} && {env}/bin/pip install torch=={TORCH_PIN} && "
            f"{env}/bin/pip install trl=={version}")


def default_python(part: str) -> Path:
    """Returns the interpreter of the TRL env for ``part`` (relative to the working directory)."""
    return ENV_ROOT / ENVS[part][0] / "bin" / "python"


def check_trl_python(part: str, python: str | Path) -> Path:
    """Returns ``python`` if it exists; else raises a one-line error naming the setup command."""
    path = Path(python)
    if not path.is_file():
        name, version = ENVS[part]
        raise TrlBenchError(
            f"TRL env for the {part.upper()} comparison not found ({path} is missing; it needs trl=={version}): "
            f"create it with `vapo-lab bench trl --setup` (or: {setup_command(part)}), "
            f"or pass --trl{'' if part == 'ppo' else '-grpo'}-python PATH")
    return path


def setup_trl_envs(parts: Sequence[str] = ("ppo", "grpo"),
                   log: Callable[[str], None] = lambda text: None) -> list[Path]:
    """Creates the TRL virtual envs under .bench-venv/ (torch first, from the local CPU wheel).

    Returns the interpreters. An existing env is reused; pip only installs what is missing.
    """
    pythons = []
    for part in parts:
        name, version = ENVS[part]
        env = ENV_ROOT / name
        if not (env / "bin" / "python").is_file():
            log(f"creating {env}")
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
        for requirement in (f"torch=={TORCH_PIN}", f"trl=={version}"):
            log(f"{env}: pip install {requirement}")
            done = subprocess.run(pip + [requirement])
            if done.returncode:
                raise TrlBenchError(f"pip install {requirement} into {env} failed (exit {done.returncode}): "
                             f"see pip's output above; retry with `{setup_command(part)}`")
        pythons.append(env / "bin" / "python")
    return pythons


class WorkerProcess:
    """A persistent worker process driven over its stdin / stdout; stderr goes to a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str], hint: str = "") -> None:
        self.name, self.log_path, self.hint = name, log_path, hint
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, text=True, bufsize=1)

    def send(self, **message: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None

    def recv(self, timeout: float = MESSAGE_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TrlBenchError(f"worker {self.name} sent nothing in {timeout:.0f}s: see {self.log_path}")
        line = self.proc.stdout.readline()
        if not line:
            raise self._died()
        return json.loads(line)

    def _died(self) -> Exception:
        code = self.proc.wait(timeout=30)
        self._log.flush()
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        return TrlBenchError(f"worker {self.name} exited with code {code}: {last} (full log: {self.log_path})"
                             + self.hint)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(cmd="stop")
            except Exception:  # noqa: BLE001 - already gone
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@dataclass
class SideResult:
    """Timings of one side: per-step seconds and generated tokens, and what the worker reported."""

    name: str
    info: dict[str, Any] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rss_mib: float = 0.0

    @property
    def s_per_step(self) -> float:
        return sum(self.seconds) / len(self.seconds)

    @property
    def median_s_per_step(self) -> float:
        ordered = sorted(self.seconds)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    @property
    def tokens_per_step(self) -> float:
        return sum(self.tokens) / len(self.tokens)


# worker name -> (part, how it is started)
SIDES = {
    "vapo-lab PPO": ("ppo", "ours", "ppo"),
    "vapo-lab VAPO": ("ppo", "ours", "vapo"),
    "TRL PPOTrainer": ("ppo", "trl", "trl-ppo"),
    "vapo-lab GRPO": ("grpo", "ours", "grpo"),
    "TRL GRPOTrainer": ("grpo", "trl", "trl-grpo"),
}
# (label, TRL side, our side)
COMPARISONS = [
    ("PPO", "TRL PPOTrainer", "vapo-lab PPO"),
    ("VAPO", "TRL PPOTrainer", "vapo-lab VAPO"),
    ("GRPO", "TRL GRPOTrainer", "vapo-lab GRPO"),
]


def _worker_env(spec: BenchSpec) -> dict[str, str]:
    env = dict(os.environ)
    threads = str(spec.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", ACCELERATE_USE_CPU="true", PYTHONUNBUFFERED="1",
               CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)  # a TRL env must not see the main env's packages
    return env


def _worker_argv(python: str | Path, kind: str, model_dir: Path, spec: BenchSpec, workdir: Path) -> list[str]:
    return [str(python), str(Path(__file__).resolve()), "--worker", kind, "--model", str(model_dir),
            "--workdir", str(workdir), "--spec", json.dumps(asdict(spec))]


def run_trl_benchmark(
    steps: int = 8,
    warmup: int = 1,
    parts: Sequence[str] = ("ppo", "grpo"),
    trl_python: str | Path | None = None,
    trl_grpo_python: str | Path | None = None,
    spec: BenchSpec = BenchSpec(),
    log: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Runs every side of ``parts`` for ``steps`` timed steps each, interleaved step by step.

    Args:
        steps: timed steps per side.
        warmup: untimed steps per side first (allocator, first-call overheads).
        parts: "ppo" (vapo-lab PPO and VAPO vs TRL PPOTrainer) and/or "grpo".
        trl_python: interpreter of the trl==1.12.0 env (default .bench-venv/trl112/bin/python).
        trl_grpo_python: interpreter of the latest-TRL env (default .bench-venv/trl-latest/bin/python).
        spec: the work of one step.
        log: progress lines.

    Returns:
        {"spec", "model_params", "steps", "warmup", "sides": {name: SideResult}}.

    Raises:
        VapoLabError: a TRL env is missing (one line naming the setup command) or a worker failed.
    """
    parts = list(dict.fromkeys(parts))
    for part in parts:
        if part not in ENVS:
            raise TrlBenchError(f"--part {part!r} is not a comparison: choose ppo or grpo")
    if steps < 1 or warmup < 0 or spec.threads < 1:
        raise TrlBenchError(f"--steps {steps} / --warmup {warmup} / --threads {spec.threads}: "
                            "need steps >= 1, warmup >= 0 and threads >= 1")
    pythons = {"ppo": trl_python or default_python("ppo"), "grpo": trl_grpo_python or default_python("grpo")}
    for part in parts:
        pythons[part] = check_trl_python(part, pythons[part])

    workdir = Path(tempfile.mkdtemp(prefix="vapo-bench-trl-"))
    workers: dict[str, WorkerProcess] = {}
    ok = False
    try:
        model_dir = workdir / "model"
        params = build_bench_model(model_dir, seed=spec.seed)
        env = _worker_env(spec)
        names = [n for n, (part, _, _) in SIDES.items() if part in parts]
        results = {n: SideResult(n) for n in names}
        for name in names:  # start all, then wait: their set-ups overlap
            part, side, kind = SIDES[name]
            python = sys.executable if side == "ours" else pythons[part]
            slug = kind if side == "trl" else f"ours-{kind}"
            (workdir / slug).mkdir()
            hint = f"; if the TRL env is incomplete, recreate it: {setup_command(part)}" if side == "trl" else ""
            workers[name] = WorkerProcess(name, _worker_argv(python, slug, model_dir, spec, workdir / slug),
                                          workdir / f"{slug}.log", env, hint)
        for name in names:
            message = workers[name].recv()
            results[name].info = message
            log(f"{name}: ready")
        load_before = os.getloadavg()[0]
        for name in names:  # warm-up, untimed
            if warmup:
                workers[name].send(cmd="run", steps=warmup)
                workers[name].recv()
        for i in range(steps):
            order = names[i % len(names):] + names[:i % len(names)]  # rotate who goes first
            for name in order:
                workers[name].send(cmd="run", steps=1)
                message = workers[name].recv()
                results[name].seconds += message["seconds"]
                results[name].tokens += message["tokens"]
                results[name].rss_mib = message["rss_mib"]
            log(f"step {i + 1}/{steps}: " + ", ".join(f"{n} {results[n].seconds[-1]:.2f}s" for n in names))
        ok = True
        return {"spec": spec, "model_params": params, "steps": steps, "warmup": warmup, "sides": results,
                "load": (load_before, os.getloadavg()[0])}
    finally:
        for worker in workers.values():
            worker.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)


def format_trl_benchmark(result: dict[str, Any]) -> str:
    """Plain-text report of ``run_trl_benchmark``: one table, the ratios and what differs."""
    spec: BenchSpec = result["spec"]
    sides: dict[str, SideResult] = result["sides"]
    any_side = next(iter(sides.values()))
    versions = sorted({f"trl {s.info['trl']} ({s.name})" for s in sides.values() if "trl" in s.info})
    lines = [
        f"vapo-lab vs TRL, one RL step on CPU: tiny Qwen2 policy of {result['model_params'] / 1e6:.2f}M parameters, "
        f"fp32, {spec.threads} threads, torch {any_side.info.get('torch', '?')}",
        f"{spec.completions} completions x <= {spec.max_new_tokens} new tokens (stop at eos), "
        f"{spec.epochs} epoch of {spec.completions // spec.mini_batch_size} optimiser steps x {spec.mini_batch_size}, "
        f"arith prompts of {2 * spec.digits + 2} tokens, verifier reward; "
        f"{result['steps']} timed steps per side after {result['warmup']} warm-up, interleaved step by step",
        "; ".join(versions) + (f"; 1-min load average {result['load'][0]:.1f} before, {result['load'][1]:.1f} after "
                               f"on {os.cpu_count()} CPUs (the benchmark alone adds about {spec.threads})"
                               if "load" in result else ""),
        "",
        f"{'side':<18} {'s/step':>7} {'median':>7} {'gen tok/step':>13} {'gen tok/s':>10} {'peak RSS':>10}",
    ]
    for s in sides.values():
        lines.append(f"{s.name:<18} {s.s_per_step:>7.2f} {s.median_s_per_step:>7.2f} {s.tokens_per_step:>13.0f} "
                     f"{s.tokens_per_s:>10.0f} {s.rss_mib:>6.0f} MiB")
    lines += ["", f"{'comparison':<34} {'s/step ratio':>12} {'median':>7} {'tok/s ratio':>12}  target >= 2x"]
    for row in compare(sides):
        verdict = "met" if min(row["speedup"], row["tokens_ratio"]) >= 2 else "NOT met"
        lines.append(f"{row['ours'] + ' vs ' + row['theirs']:<34} {row['speedup']:>11.2f}x "
                     f"{row['median_speedup']:>6.2f}x {row['tokens_ratio']:>11.2f}x  {verdict}")
    lines += ["", "s/step: mean over the timed steps; ratios: TRL s/step / vapo-lab s/step (mean, and of the medians)",
              "and vapo-lab tok/s / TRL tok/s, above 1 where vapo-lab is faster; the target is judged on the means.",
              "gen tok/s = generated tokens (eos included) / whole-step seconds (rollout + grading + updates).",
              "What differs:"]
    lines += [f"- {note}" for note in _differences(sides)]
    return "\n".join(lines)


def compare(sides: dict[str, SideResult]) -> list[dict[str, Any]]:
    """Returns one row per comparison present: our side, TRL's, and the two ratios.

    ``speedup`` is TRL's mean s/step over ours (``median_speedup``: of the medians),
    ``tokens_ratio`` our generated tokens/s over TRL's; above 1 vapo-lab is faster.
    """
    rows = []
    for label, theirs, ours in COMPARISONS:
        if theirs in sides and ours in sides:
            a, b = sides[theirs], sides[ours]
            rows.append({"label": label, "ours": ours, "theirs": theirs, "speedup": a.s_per_step / b.s_per_step,
                         "median_speedup": a.median_s_per_step / b.median_s_per_step,
                         "tokens_ratio": b.tokens_per_s / a.tokens_per_s})
    return rows


def _differences(sides: dict[str, SideResult]) -> list[str]:
    """Returns the printed notes on where the two sides' work is not the same."""
    notes = []
    if "TRL PPOTrainer" in sides:
        notes += [
            "PPO: TRL updates policy and value model with one optimiser on pg_loss + 0.1 * vf_loss "
            "(one backward through both); vapo-lab runs separate critic and actor updates (two "
            "optimisers, two backwards): the same forward/backward work, plus vapo-lab's grad clipping "
            "(TRL's PPO loop clips nothing).",
            "PPO: both run a frozen reference model for the KL penalty in the reward (k1, 0.05, TRL's "
            "default). VAPO has no KL term, so vapo-lab VAPO runs no reference model while TRL's "
            "PPOTrainer always does: that forward pass is skipped on our side.",
            "VAPO samples 8 prompts x 8 (its group sampling) and prefills each prompt once; TRL's "
            "PPOTrainer has one sample per prompt (64 prompts, 64 prefills). VAPO's critic starts from "
            "the policy, with no reward model or value pretraining (one-off phases before step 1).",
            "PPO: TRL's rollout keeps the logits of every generated token (output_scores) and runs "
            "the value model over the whole sequence; vapo-lab's sampler returns log-probs and its "
            "training passes apply the LM head to response positions only.",
        ]
    if "TRL GRPOTrainer" in sides:
        notes += [
            "GRPO: TRL recomputes the old log-probs with an extra forward pass (its 4 optimiser steps "
            "per generation make the policy stale); vapo-lab uses the sampler's log-probs, computed "
            "by the same fp32 model at sampling time. Both run the reference model (k3 KL in the "
            "loss, beta 0.04). TRL computes log-probs with its chunked LM-head kernel (no full "
            "logits); vapo-lab materialises the response positions' logits and their entropy (a metric).",
        ]
    notes.append("Nothing else is skipped on our side: every backward pass runs, also when all advantages "
                 "are zero (a random policy rarely solves a problem: rewards are mostly 0 on both sides).")
    return notes


# -------------------------------------------------------------------------------------------------
# Entry points


def _worker_main(kind: str, model_dir: str, workdir: str, spec_json: str) -> None:
    spec = BenchSpec(**json.loads(spec_json))
    if kind.startswith("ours-"):
        _serve_ours(kind.removeprefix("ours-"), model_dir, spec, workdir)
    elif kind == "trl-ppo":
        _serve_trl_ppo(model_dir, spec, workdir)
    elif kind == "trl-grpo":
        _serve_trl_grpo(model_dir, spec, workdir)
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark and prints its report (``python -m vapo_lab.bench.trl``), or a worker."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=BenchSpec.threads)
    parser.add_argument("--part", action="append", choices=sorted(ENVS))
    parser.add_argument("--trl-python")
    parser.add_argument("--trl-grpo-python")
    parser.add_argument("--setup", action="store_true")
    parser.add_argument("--worker")
    parser.add_argument("--model")
    parser.add_argument("--workdir")
    parser.add_argument("--spec")
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker, args.model, args.workdir, args.spec)
        return
    parts = args.part or ["ppo", "grpo"]

    def progress(text: str) -> None:
        print(text, file=sys.stderr)

    if args.setup:
        setup_trl_envs(parts, log=progress)
        return
    result = run_trl_benchmark(steps=args.steps, warmup=args.warmup, parts=parts, trl_python=args.trl_python,
                               trl_grpo_python=args.trl_grpo_python, spec=BenchSpec(threads=args.threads),
                               log=progress)
    print(format_trl_benchmark(result))


if __name__ == "__main__":
    # Run by path (a TRL env's interpreter runs this file): Python put this file's folder first on
    # sys.path, where this very file would shadow the `trl` package. Take it off.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    main()
