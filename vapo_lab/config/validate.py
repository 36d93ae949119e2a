"""Whole-config validation: every problem at once, each on one line with the exact key to fix.

Runs at compose time, before any model is built, so that a bad value costs nothing.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vapo_lab.algo.gae import ADVANTAGE_ESTIMATORS, LAMBDA_CRITIC_MODES, LAMBDA_POLICY_MODES
from vapo_lab.algo.kl import KL_ESTIMATORS, KL_TARGETS
from vapo_lab.algo.policy import LOSS_AGG_MODES
from vapo_lab.conf import options
from vapo_lab.config.schema import CRITIC_INITS
from vapo_lab.distributed.world import MESHES, STRATEGIES
from vapo_lab.models.dtypes import DTYPES
from vapo_lab.names import check_name
from vapo_lab.registry.components import COMPONENTS, settings
from vapo_lab.tasks import task_names


def modes() -> dict[str, tuple[str, ...]]:
    """Returns {key: its valid values}, each list read from where it is kept: the maths in
    ``vapo_lab.algo``, the task registry, or the options of a config group under conf/ (a key
    that names its group's option: ``model.name``, ``rollout.backend``, ``tracking.backend``)."""
    return {
        "model.name": tuple(options("model")),
        "model.dtype": tuple(DTYPES),
        "task.name": tuple(task_names()),
        "rollout.backend": tuple(options("rollout")),
        "algo.advantage": ADVANTAGE_ESTIMATORS,
        "gae.lam_policy_mode": LAMBDA_POLICY_MODES,
        "gae.lam_critic_mode": LAMBDA_CRITIC_MODES,
        "loss.agg": LOSS_AGG_MODES,
        "critic.loss_agg": LOSS_AGG_MODES,
        "critic.init": CRITIC_INITS,
        "kl.estimator": KL_ESTIMATORS,
        "kl.target": KL_TARGETS,
        "tracking.backend": tuple(options("tracking")),
        "trainer.strategy": STRATEGIES,
        "trainer.mesh": MESHES,
    }


# the highest temperature vLLM samples at (vllm/sampling_params.py _verify_args)
VLLM_MAX_TEMPERATURE = 2.0
# (key, lower, upper, lower inclusive, upper inclusive); None = unbounded
RANGES: list[tuple[str, float | None, float | None, bool, bool]] = [
    ("gae.gamma", 0.0, 1.0, False, True),
    ("gae.lam_policy", 0.0, 1.0, True, True),
    ("gae.lam_critic", 0.0, 1.0, True, True),
    ("gae.alpha", 0.0, None, False, False),
    ("critic.pretrain.lam", 0.0, 1.0, True, True),
    ("loss.eps_low", 0.0, 1.0, True, False),
    ("loss.mu", 0.0, None, True, False),
    ("loss.entropy_coef", 0.0, None, True, False),
    ("kl.coef", 0.0, None, True, False),
    ("rollout.temperature", 0.0, None, False, False),
    ("rollout.eval_temperature", 0.0, None, False, False),
    ("rollout.top_p", 0.0, 1.0, False, True),
    ("rollout.eval_top_p", 0.0, 1.0, False, True),
    ("rollout.responses_per_step", 1, None, True, False),
    ("rollout.group_size", 1, None, True, False),
    ("rollout.n_samples", 1, None, True, False),
    ("rollout.max_new_tokens", 1, None, True, False),
    ("rollout.eval_samples", 1, None, True, False),
    ("rollout.max_resample_rounds", 0, None, True, False),
    ("critic.pretrain.steps", 0, None, True, False),
    ("trainer.total_steps", 1, None, True, False),
    ("trainer.ppo_epochs", 1, None, True, False),
    ("trainer.mini_batch_size", 1, None, True, False),
    ("trainer.max_tokens_per_micro_batch", 1, None, True, False),
    ("trainer.actor_lr", 0.0, None, False, False),
    ("trainer.critic_lr", 0.0, None, False, False),
    ("trainer.warmup_steps", 0, None, True, False),
    ("trainer.weight_decay", 0.0, None, True, False),
    ("trainer.grad_clip", 0.0, None, False, False),
    ("trainer.eval_every", 1, None, True, False),
    ("trainer.save_every", 1, None, True, False),
    ("trainer.nproc_per_node", 1, None, True, False),
    ("trainer.nodes", 1, None, True, False),
    ("trainer.collective_timeout_min", 1, None, True, False),
    ("rollout.vllm.tensor_parallel_size", 1, None, True, False),
    ("rollout.vllm.sleep_level", 1, 2, True, True),
    ("rollout.vllm.weight_bucket_mb", 1, None, True, False),
    ("rollout.vllm.cpu_kv_cache_gb", 0.0, None, False, False),
]


def validate(cfg: DictConfig) -> list[str]:
    """Returns every problem of a composed config, one line each (empty when it is valid)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        return [
            f"{key} is required but not set: add {key}=<value> to the command" for key in missing
        ]
    try:
        c: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        return [f"config cannot be resolved: {str(e).splitlines()[0]}"]
    return check_values(c)


def check_values(c: dict[str, Any]) -> list[str]:
    """Returns every problem of the values of a resolved config (``validate`` without its missing
    keys and interpolations: what a grid's cells composed by value need checked)."""

    def get(key: str) -> Any:
        node: Any = c
        for part in key.split("."):
            node = node[part]
        return node

    problems: list[str] = [
        f"{key}={v} is not a finite number: set {key} to a finite value"
        for key, v in _float_settings(c)
        if not math.isfinite(v)
    ]
    bad_floats = {p.split("=", 1)[0] for p in problems}
    for key, valid in modes().items():
        if get(key) not in valid:
            problems.append(
                f"{key}={get(key)} is not a valid choice: set {key} to one of {', '.join(valid)}"
            )
    for key, lo, hi, lo_in, hi_in in RANGES:
        v = get(key)
        if key in bad_floats:  # NaN compares false with every bound: said above, not range-checked
            continue
        bad = (lo is not None and (v < lo or (v == lo and not lo_in))) or (
            hi is not None and (v > hi or (v == hi and not hi_in))
        )
        if bad:
            left, right = ("[" if lo_in else "(") + f"{lo}", f"{hi}" + ("]" if hi_in else ")")
            span = f"{left}, {right}" if hi is not None else (f">= {lo}" if lo_in else f"> {lo}")
            problems.append(f"{key}={v} is out of range: it must be {span}")
    every = get("critic.save_every")
    if every is not None and (not isinstance(every, int) or every < 1):
        problems.append(
            f"critic.save_every={every} is out of range: it must be a whole number >= 1 "
            "(rounds between saves), or null (every 10 minutes of rounds)"
        )
    if c.get("run_name") is not None:
        try:
            check_name(str(c["run_name"]), "run_name")
        except ValueError as e:
            problems.append(str(e))
    if not problems:
        problems += _relations(get)
    return problems


def _float_settings(node: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Returns (dotted key, value) of every float in a resolved config: the schema types each float
    setting, so this finds all of them (list items as key[i]), whatever their key."""
    if isinstance(node, dict):
        return [
            kv
            for k, v in node.items()
            for kv in _float_settings(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
        ]
    if isinstance(node, list):
        return [kv for i, v in enumerate(node) for kv in _float_settings(v, f"{prefix}[{i}]")]
    return [(prefix, node)] if isinstance(node, float) else []


def _relations(get: Any) -> list[str]:
    """Returns problems that involve more than one key."""
    problems: list[str] = []
    eps_low, eps_high = get("loss.eps_low"), get("loss.eps_high")
    if eps_high < eps_low:
        problems.append(
            f"loss.eps_high={eps_high} is below eps_low={eps_low}: clip-higher only widens the "
            "upper "
            f"bound. Set loss.eps_high>={eps_low}, or choose clip_higher=off."
        )
    dual = get("loss.dual_clip")
    if dual is not None and dual <= 1:
        problems.append(
            f"loss.dual_clip={dual} must be > 1 (e.g. 3.0), or null to disable dual clip"
        )
    batch, n = get("rollout.responses_per_step"), get("rollout.n_samples")
    if batch % n:
        problems.append(
            f"rollout.responses_per_step={batch} is not divisible by rollout.n_samples={n} "
            f"(samples per prompt): choose a multiple of {n}, or another rollout.group_size"
        )
    pool, n_train = get("trainer.prompt_pool"), get("task.n_train")
    if pool is not None and not batch // max(n, 1) <= pool <= n_train:
        problems.append(
            f"trainer.prompt_pool={pool} must hold one step's {batch // max(n, 1)} prompts and at "
            "most "
            f"task.n_train={n_train}: set it in [{batch // max(n, 1)}, {n_train}], or null for "
            "every train problem"
        )
    mini = get("trainer.mini_batch_size")
    if batch % mini:
        problems.append(
            f"trainer.mini_batch_size={mini} does not divide rollout.responses_per_step={batch}: "
            "choose a divisor so every optimiser step sees a full mini-batch"
        )
    if get("algo.advantage") == "group":
        if n < 2:
            problems.append(
                "algo.advantage=group needs groups but rollout.n_samples=1: choose "
                "group_sampling=on "
                "(or a preset with a critic: --algo vapo / ppo)"
            )
        for c in COMPONENTS:
            if c.needs_critic and all(get(key) == on for key, (on, _) in settings(c).items()):
                problems.append(
                    f"{c.name}=on needs a critic but algo.advantage=group has none: "
                    f"choose {c.name}=off, or algo.advantage=gae"
                )
    overlong = get("reward.overlong")
    if overlong["enabled"] and not 0 < overlong["l_cache"] <= overlong["l_max"]:
        problems.append(
            f"reward.overlong.l_cache={overlong['l_cache']} must be in (0, "
            f"l_max={overlong['l_max']}]: "
            "set a smaller l_cache, or reward.overlong.enabled=false"
        )
    if get("model.name") == "hf" and not get("model.path"):
        problems.append(
            "model.path is required for model=hf: set model.path=/path/to/local/checkpoint "
            "(weights are never downloaded)"
        )
    if get("task.name") == "math" and not get("task.train_path"):
        problems.append(
            "task.train_path is required for task=math: set task.train_path=/path/to/train.jsonl "
            "(or .parquet)"
        )
    impl = get("trainer.adam_impl")
    if impl not in ("fused", "foreach", "for-loop"):
        problems.append(
            f"trainer.adam_impl={impl} is not an AdamW implementation: use fused, foreach or "
            "for-loop"
        )
    device = get("trainer.device")
    if device not in ("auto", "cpu", "cuda") and not str(device).startswith("cuda:"):
        problems.append(f"trainer.device={device} is not a device: use auto, cpu, cuda or cuda:N")
    problems += _ranks(get)
    problems += _mesh(get)
    if get("rollout.backend") == "vllm":
        for key in ("rollout.temperature", "rollout.eval_temperature"):
            if get(key) > VLLM_MAX_TEMPERATURE:  # vLLM's SamplingParams refuses it mid-run
                problems.append(
                    f"{key}={get(key)}: vLLM samples at temperatures in [0, 2]; lower it, or use "
                    "rollout.backend=builtin"
                )
    if get("task.name") == "arith":
        problems += _arith_answer_fits(int(get("rollout.max_new_tokens")), get("task.options"))
    return problems


def _ranks(get: Any) -> list[str]:
    """Returns problems of a many-rank run: each rank samples whole groups of an equal share of the
    step's prompts, so the prompts per step must divide among the ranks."""
    ranks = get("trainer.nodes") * get("trainer.nproc_per_node")
    tp = get("rollout.vllm.tensor_parallel_size")
    per_node = get("trainer.nproc_per_node")
    if get("rollout.backend") == "vllm" and per_node % tp:
        # an engine spans tp consecutive ranks: within a node only, as its NCCL groups need
        return [
            f"rollout.vllm.tensor_parallel_size={tp} does not divide trainer.nproc_per_node="
            f"{per_node}: an engine spans tp consecutive ranks of one node; choose a divisor of "
            "the ranks per node"
        ]
    if ranks == 1:
        return []
    if get("trainer.strategy") != "fsdp":
        return [
            f"trainer.nodes x trainer.nproc_per_node = {ranks} ranks needs trainer.strategy=fsdp "
            "(strategy single is one process)"
        ]
    prompts = get("rollout.responses_per_step") // get("rollout.n_samples")
    if prompts % ranks:
        return [
            f"{prompts} prompts per step (rollout.responses_per_step / rollout.n_samples) do not "
            "divide among "
            f"{ranks} ranks: choose rollout.responses_per_step as a multiple of "
            f"{ranks * get('rollout.n_samples')}, "
            "or another rank count"
        ]
    return []


def _mesh(get: Any) -> list[str]:
    """Returns the problem of trainer.mesh=hsdp on one node: it replicates the model across nodes,
    so with one there is nothing to replicate across."""
    nodes = get("trainer.nodes")
    if get("trainer.mesh") != "hsdp" or nodes > 1:
        return []
    return [
        f"trainer.mesh=hsdp shards within a node and replicates across nodes, but trainer.nodes="
        f"{nodes}: set trainer.mesh=flat (one node shards over all its ranks), or trainer.nodes "
        "to the number of nodes"
    ]


def _arith_answer_fits(max_new_tokens: int, options: dict[str, Any]) -> list[str]:
    """Returns a problem when ``max_new_tokens`` is below the shortest correct response of
    task=arith (the scratchpad and boxed answer of a ``min_digits`` problem): then no response could
    be
    right."""
    import inspect

    from vapo_lab.tasks.arith import ArithTask, response_tokens

    defaults = inspect.signature(ArithTask).parameters
    low = options.get("min_digits", defaults["min_digits"].default)
    high = options.get("max_digits", defaults["max_digits"].default)
    if not isinstance(low, int) or not isinstance(high, int) or low < 1:
        return []  # the task itself refuses bad digit options, with their fix
    shortest = response_tokens(low)
    if max_new_tokens >= shortest:
        return []
    return [
        f"rollout.max_new_tokens={max_new_tokens} is below the shortest correct response of "
        "task=arith: "
        f"the scratchpad and \\boxed{{}} answer of a {low}-digit problem "
        f"(task.options.min_digits={low}) take "
        f"{shortest} tokens, so no response could be complete. Set "
        f"rollout.max_new_tokens>={shortest} "
        f"({response_tokens(high, final_carry=True) + 1} fits every problem up to {high} digits, "
        "end-of-sequence "
        "included)"
    ]
