"""The plan of a run: its model's shape, its sizes and what one rank needs
(``vapo_lab.models.footprint``), whether that fits the devices this machine gives each rank, the
fixes when it does not, and the smallest setting within a time. ``vapo-lab plan`` prints it;
``vapo_lab.config.preflight.check_run`` refuses a local run that cannot fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vapo_lab.algo.lm import default_chunk_tokens
from vapo_lab.config.schema import RM_INITS
from vapo_lab.errors import ConfigError
from vapo_lab.models.footprint import (
    ALLOCATOR_HEADROOM,
    GB,
    Footprint,
    Hardware,
    Setup,
    estimate,
    share_bound,
    smallest_world,
)
from vapo_lab.models.shapes import KNOWN_ARCHS, Shape, known_arch, read_shape

# a plan's estimate of the longest prompt (tokens): a maths problem with its instructions (DAPO's
# math prompts run ~100-300 tokens); `vapo-lab plan --prompt-tokens` sets another
PROMPT_TOKENS = 512
# the built-in sampler decodes at most this many rows at once (vapo_lab.rollout.sampler.sample's
# max_batch)
BUILTIN_ROWS = 256


@dataclass(frozen=True)
class RunPlan:
    """A run's model shape, its sizes and what one rank of it needs
    (``vapo_lab.models.footprint``)."""

    model: str  # where the shape came from, e.g. "Qwen2.5-32B (model.arch_name)"
    shape: Shape
    setup: Setup
    footprint: Footprint
    memory: float  # bytes a GPU (or a CPU rank's share of the host) the plan is made for
    prompts_per_step: int  # they divide among the ranks
    hardware: Hardware = Hardware()  # the rates its times are estimated at
    collective_timeout: float = 7200.0  # seconds: trainer.collective_timeout_min


def model_shape(cfg: Any) -> tuple[Shape, str]:
    """Returns (the shape of the run's policy, where it came from): model=tiny's ``model.arch`` with
    the task's vocabulary, a checkpoint's config.json (``model.path``, read locally), or a known
    public architecture (``model.arch_name``).

    Raises:
        ConfigError: model=hf with neither, an unknown arch_name, or an unreadable config.json.
    """
    m = cfg.model
    if m.name == "tiny":
        a = m.arch
        # build_tiny_model: Qwen2 with q/k/v biases and tied embeddings, head size h / a
        shape = Shape(
            hidden_size=int(a.hidden_size),
            num_layers=int(a.num_layers),
            num_heads=int(a.num_heads),
            num_kv_heads=int(a.num_kv_heads),
            head_dim=int(a.hidden_size) // int(a.num_heads),
            intermediate_size=int(a.intermediate_size),
            vocab_size=_tiny_vocab(cfg),
            tie_word_embeddings=True,
            max_position_embeddings=int(a.max_position_embeddings),
        )
        return shape, "the embedded tiny model (model.arch)"
    if m.path:
        return read_shape(m.path), f"{m.path}/config.json"
    if m.get("arch_name"):
        return known_arch(m.arch_name), f"{m.arch_name} (model.arch_name)"
    raise ConfigError(
        f"model={m.name} has no shape to plan with: set model.path to a local checkpoint, or "
        f"model.arch_name to one of {', '.join(KNOWN_ARCHS)}"
    )


def _tiny_vocab(cfg: Any) -> int:
    """Returns the embedded tokenizer's size for the run's task: bytes and specials, plus each task
    word of task=arith bare and with a leading space (vapo_lab.models.tokenizer)."""
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks import build_task

    words: list[str] = []
    if cfg.task.name == "arith":  # its words depend on the digit options only: no problems needed
        words = build_task(
            "arith", seed=int(cfg.task.seed), n_train=0, n_eval=0, **dict(cfg.task.options)
        ).vocabulary()
    return len(build_tokenizer(words))


def plan_run(
    cfg: Any, memory: float, prompt_tokens: int = PROMPT_TOKENS, device: str = "cuda"
) -> RunPlan:
    """Returns the plan of run ``cfg`` for ``device`` (cuda or cpu) ranks of ``memory`` bytes each.

    The world is trainer.nodes x trainer.nproc_per_node; vLLM takes
    rollout.vllm.gpu_memory_utilization of ``memory`` and sleeps in the update when
    enable_sleep_mode is on; the critic is trained when algo.advantage=gae, the reference policy
    kept when kl.coef > 0. Under fsdp on CPU the layers compute in the fp32 of their shards
    (``vapo_lab.distributed.fsdp``: bf16 compute is for GPUs).
    """
    shape, model = model_shape(cfg)
    t, r = cfg.trainer, cfg.rollout
    vllm = r.backend == "vllm"
    v = r.get("vllm") or {}
    # .get: a run saved before these keys existed resumes with its own config.yaml
    strategy = str(t.get("strategy", "single"))
    dtype = "float32" if strategy == "fsdp" and device == "cpu" else str(cfg.model.dtype)
    setup = Setup(
        world=int(t.get("nodes", 1)) * int(t.get("nproc_per_node", 1)),
        strategy=strategy,
        dtype=dtype,
        micro_tokens=int(t.max_tokens_per_micro_batch),
        responses_per_step=int(r.responses_per_step),
        prompt_tokens=int(prompt_tokens),
        max_new_tokens=int(r.max_new_tokens),
        gradient_checkpointing=bool(cfg.model.gradient_checkpointing),
        mini_batch_size=int(t.mini_batch_size),
        critic=cfg.algo.advantage == "gae",
        reference=float(cfg.kl.coef) > 0,
        engine="vllm" if vllm else "builtin",
        builtin_rows=BUILTIN_ROWS,
        tensor_parallel_size=int(v.get("tensor_parallel_size", 1)),
        engine_memory=float(v.get("gpu_memory_utilization", 0.0)) * memory if vllm else 0.0,
        engine_sleeps=bool(v.get("enable_sleep_mode", True)),
        offload=bool(t.get("offload_during_rollout", False)),
        logprob_chunk=default_chunk_tokens(shape.vocab_size),
        ppo_epochs=int(t.ppo_epochs),
        reward_model=cfg.algo.advantage == "gae" and cfg.critic.init in RM_INITS,
        value_pretraining=cfg.algo.advantage == "gae" and bool(cfg.critic.pretrain.enabled),
        eval_responses=_eval_problems(cfg.task) * int(r.eval_samples),
        ranks_per_node=int(t.get("nproc_per_node", 1)),
        mesh=str(t.get("mesh", "flat")),
        sleep_level=int(v.get("sleep_level", 2)),
        total_steps=int(t.total_steps),
        save_every=int(t.save_every),
        headroom=ALLOCATOR_HEADROOM if device == "cuda" else 1.0,
        cuda=device == "cuda",
        sample_bytes=2 if device == "cuda" else 4,
    )
    prompts = max(1, int(r.responses_per_step) // int(r.n_samples))
    timeout = 60.0 * float(t.get("collective_timeout_min", 120))
    return RunPlan(
        model, shape, setup, estimate(shape, setup), memory, prompts, collective_timeout=timeout
    )


# AIME 2024's problems: the held-out set a task=math run without task.n_eval is planned for
AIME_PROBLEMS = 30


def _eval_problems(task: Any) -> int:
    """Returns the held-out problems of ``task``: task.n_eval when positive, else the lines of
    task.eval_path where it is a JSONL file here, else ``AIME_PROBLEMS``."""
    n = int(task.get("n_eval") or 0)
    if n > 0:
        return n
    path = Path(str(task.get("eval_path") or ""))
    if path.suffix == ".jsonl" and path.is_file():
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    return AIME_PROBLEMS


def fewest_ranks(plan: RunPlan, engine_at_minimum: bool = False) -> int | None:
    """Returns the fewest fsdp ranks (GPUs) on which ``plan``'s run fits its memory, a divisor of
    the prompts per step (each rank samples an equal share of whole groups); None when no count
    does. ``engine_at_minimum``: with vLLM's share at the least it needs, not as configured."""
    return smallest_world(
        plan.shape,
        plan.setup,
        plan.memory,
        divides=plan.prompts_per_step,
        engine_at_minimum=engine_at_minimum,
    )


# the vLLM settings ``fastest_within`` tries beside the configured ones: verl's DAPO-32B recipe
# gives its engine 0.8 of each GPU, which the training state's offload leaves room for
ENGINE_SHARES = (0.8,)
TENSOR_PARALLEL = (1, 2, 4, 8)


def fastest_within(plan: RunPlan, seconds: float) -> tuple[int, dict[str, Any], float] | None:
    """Returns the smallest setting whose estimated step takes under ``seconds`` and fits: (fsdp
    ranks N, the config changes it needs beside N, its step's seconds), or None.

    N runs over the divisors of the prompts per step, fewest first; at each, the configured
    setting is tried first, then (under vLLM) every tensor-parallel size dividing N, the configured
    share and ``ENGINE_SHARES``, with and without offload during the rollout.
    """
    s = plan.setup
    keys = (
        "rollout.vllm.tensor_parallel_size",
        "rollout.vllm.gpu_memory_utilization",
        "trainer.offload_during_rollout",
    )
    configured = (s.tensor_parallel_size, s.engine_memory / plan.memory, s.offload)
    variants = [configured]
    if s.engine == "vllm":
        variants += [
            (tp, share, off)
            for off in (s.offload, True)
            for share in (configured[1], *ENGINE_SHARES)
            for tp in TENSOR_PARALLEL
        ]
    for n in range(1, plan.prompts_per_step + 1):
        if plan.prompts_per_step % n:
            continue
        for tp, share, off in variants:
            if n % tp:
                continue
            setup = replace(
                s,
                world=n,
                strategy="fsdp",
                tensor_parallel_size=tp,
                engine_memory=share * plan.memory,
                offload=off,
            )
            fp = estimate(plan.shape, setup, plan.hardware)
            if fp.fits(plan.memory) and fp.step_seconds < seconds:
                changed = {k: v for k, v, c in zip(keys, (tp, share, off), configured) if v != c}
                return n, changed, fp.step_seconds
    return None


def smallest_gpu(ids: list[int] | None = None) -> tuple[int, Any]:
    """Returns (index, properties) of the visible GPU with the least memory among ``ids`` (None:
    all); CUDA must be available."""
    import torch

    ids = list(range(torch.cuda.device_count())) if ids is None else ids
    smallest = min(ids, key=lambda i: torch.cuda.get_device_properties(i).total_memory)
    return smallest, torch.cuda.get_device_properties(smallest)


def device_memory(cfg: Any) -> tuple[float, str, str] | None:
    """Returns (bytes one rank of run ``cfg`` has, what they are, cuda or cpu) on this machine, or
    None where it cannot tell (trainer.device=cuda with no GPU visible: the run fails on that with
    its own message).

    On CUDA: the smallest visible GPU's total memory (``torch.cuda.get_device_properties``; each
    rank takes one GPU). On CPU: the host's RAM (/proc/meminfo MemTotal), shared by the
    trainer.nproc_per_node ranks of the node.
    """
    import torch

    name = str(cfg.trainer.device)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            return None
        smallest, props = smallest_gpu([int(name.split(":")[1])] if ":" in name else None)
        return float(props.total_memory), f"cuda:{smallest}, {props.name}", "cuda"
    total = _host_memory()
    if total is None:
        return None
    ranks = int(cfg.trainer.get("nproc_per_node", 1))
    shared = f" of {total / GB:.1f} GB, shared by {ranks} ranks" if ranks > 1 else ""
    return total / ranks, f"this host's RAM{shared}", "cpu"


def _host_memory() -> float | None:
    """Returns MemTotal of /proc/meminfo in bytes, None where there is no such file."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def fit_problems(cfg: Any) -> list[str]:
    """Returns one line when run ``cfg`` cannot fit the devices this machine gives each rank (see
    ``device_memory``), with the plan's numbers and the fixes; [] when it fits, or where the
    devices or the model's shape cannot be known here (the run then fails on those, clearly)."""
    have = device_memory(cfg)
    if have is None:
        return []
    memory, what, device = have
    try:
        plan = plan_run(cfg, memory, device=device)
    except ConfigError:
        return []  # no config.json (yet): loading the model names the problem
    fp = plan.footprint
    problems = []
    # an evaluation of many held-out responses can outlast a step's rollout (MATH-500 x 32)
    bound = max(fp.rollout_seconds, fp.eval_seconds)
    if device == "cuda" and plan.collective_timeout < bound < math.inf:
        what = "rollout" if bound == fp.rollout_seconds else "evaluation"
        problems.append(
            f"trainer.collective_timeout_min={plan.collective_timeout / 60:g} is below the plan's "
            f"bound for one {what}, {bound / 60:.0f} min (ranks wait for the slowest "
            f"engine in the first collective after sampling): set "
            f"trainer.collective_timeout_min={math.ceil(bound / 60) + 10}"
        )
    if fp.fits(memory):
        return problems
    return problems + [
        f"{_need_text(plan)} but each rank has {memory / GB:.1f} GB ({what}): {fixes(plan)}; "
        f"`vapo-lab plan` shows the numbers"
    ]


def _need_text(plan: RunPlan) -> str:
    """Returns 'the run needs X GB a rank (...)' with the phase that sets it."""
    fp, s = plan.footprint, plan.setup
    largest = fp.largest_phase
    reserve = f"; + {fp.reserve / GB:.1f} GB CUDA context and NCCL" if fp.reserve else ""
    if largest is not None and largest.name not in ("update", "rollout"):
        headroom = f" x {fp.headroom:g}" if fp.headroom != 1 else ""
        engine = f" + vLLM's {largest.engine / GB:.1f}" if largest.engine else ""
        return (
            f"the run needs {fp.need / GB:.1f} GB a rank ({largest.name}: {largest.how}, "
            f"{largest.tensors / GB:.1f} GB{headroom}{engine}{reserve})"
        )
    acts = max(fp.actor_activations, fp.critic_activations)
    times = f" x {fp.headroom:g}" if fp.headroom != 1 else ""
    update = (
        f"update {fp.train_peak / GB:.1f} GB{times}: state {fp.state / GB:.1f} + activations "
        f"{acts / GB:.1f} "
        f"for a pass of {fp.pass_tokens} tokens"
        + (f" + gathered {fp.gathered / GB:.1f}" if fp.gathered else "")
    )
    if fp.vllm:
        rollout = (
            f"rollout {fp.rollout_peak / GB:.1f} GB: {'' if fp.offload else 'state + '}vLLM's "
            f"{s.engine_memory / GB:.1f}, which must hold "
            f"{fp.engine_minimum / GB:.1f} (weights + one sequence's KV cache)"
        )
    else:
        rollout = (
            f"rollout {fp.rollout_peak / GB:.1f} GB: state + KV cache of {fp.sequences_at_once} x "
            f"{fp.sequence} tokens"
        )
    return f"the run needs {fp.need / GB:.1f} GB a rank ({update}; {rollout}{reserve})"


def fixes(plan: RunPlan) -> str:
    """Returns the fixes that apply to ``plan``, most effective first, as one clause."""
    fp, s = plan.footprint, plan.setup
    fixes = []
    share = share_bound(fp.engine_minimum / plan.memory, upper=False)
    fewest = fewest_ranks(plan)
    ranks = "more ranks with trainer.strategy=fsdp (trainer.nproc_per_node x trainer.nodes)"
    if fewest is not None and fewest > s.world:
        fixes.append(f"{ranks}: at least {fewest}")
    elif fewest is None and fp.vllm and fewest_ranks(plan, engine_at_minimum=True) is not None:
        fixes.append(
            f"{ranks}: at least {fewest_ranks(plan, engine_at_minimum=True)} with "
            f"rollout.vllm.gpu_memory_utilization={share:.2f}"
        )
    if not s.gradient_checkpointing:
        fixes.append(
            "model.gradient_checkpointing=true (actor activations "
            f"{fp.actor_activations_full / GB:.1f} -> "
            f"{fp.actor_activations_ckpt / GB:.1f} GB)"
        )
    smaller = [
        b * fp.sequence
        for b in range(fp.pass_tokens // fp.sequence - 1, 0, -1)
        if estimate(plan.shape, replace(s, micro_tokens=b * fp.sequence)).train_peak <= plan.memory
    ]
    if smaller:
        fixes.append(
            f"trainer.max_tokens_per_micro_batch={smaller[0]} (the update then fits; "
            f"{fp.pass_tokens} tokens a pass now)"
        )
    if fp.vllm and not fp.offload and fp.rollout_peak > plan.memory:
        fixes.append(
            "trainer.offload_during_rollout=true (the training state in host memory while vLLM "
            "samples)"
        )
    if fp.vllm and fp.engine_memory < fp.engine_minimum:
        fixes.append(
            f"rollout.vllm.gpu_memory_utilization >= {share:.2f}, or a larger "
            "rollout.vllm.tensor_parallel_size"
        )
    elif not fp.vllm and fp.rollout_peak > plan.memory:
        fixes.append("fewer rollout.responses_per_step or rollout.max_new_tokens")
    return (
        "fix with one or more of: " + "; ".join(fixes) if fixes else "use a device with more memory"
    )


__all__ = [
    "AIME_PROBLEMS",
    "BUILTIN_ROWS",
    "PROMPT_TOKENS",
    "RunPlan",
    "device_memory",
    "fastest_within",
    "fewest_ranks",
    "fit_problems",
    "fixes",
    "model_shape",
    "plan_run",
    "smallest_gpu",
]
