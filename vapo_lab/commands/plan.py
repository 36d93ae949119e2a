"""`vapo-lab plan`: what a run needs (parameters, memory, KV cache, tokens, GPUs) before it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from vapo_lab.commands.output import (
    Col,
    DropOpt,
    OverridesArg,
    PresetOpt,
    cli_errors,
    print_table,
    stdout,
)

if TYPE_CHECKING:
    from vapo_lab.config.plan import RunPlan


@cli_errors
def plan(
    overrides: OverridesArg = None,
    algo: PresetOpt = None,
    drop: DropOpt = None,
    gpu_memory_gb: Annotated[
        Optional[float],
        typer.Option(
            "--gpu-memory-gb",
            help="Memory of one GPU in GB (10^9 bytes); default: this machine's smallest GPU's "
            "total where CUDA is present, else 80 (an A100/H100 80GB).",
        ),
    ] = None,
    prompt_tokens: Annotated[
        Optional[int], typer.Option(help="Estimate of the longest prompt in tokens (default 512).")
    ] = None,
) -> None:
    """Print the resources a config needs and the fewest GPUs that hold it, before it runs.

    Parameter counts, memory per GPU (weights, gradients, optimizer state, activations with and
    without checkpointing), KV cache and tokens per step. Reads no weights; model=hf takes the
    shape from model.path's config.json or model.arch_name.

    Example:
    vapo-lab plan scale=paper trainer.strategy=fsdp trainer.nproc_per_node=8 trainer.nodes=16
    """
    from vapo_lab.config.attempt import attempt_times, budget_rows
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.plan import PROMPT_TOKENS, plan_run
    from vapo_lab.errors import ConfigError

    if gpu_memory_gb is None:
        gpu_memory_gb = _this_gpu_gb() or DEFAULT_GPU_GB
    if gpu_memory_gb <= 0:
        raise ConfigError(
            f"--gpu-memory-gb {gpu_memory_gb:g} is not a memory size: "
            "give the GB of one GPU, e.g. 80"
        )
    if prompt_tokens is not None and prompt_tokens < 1:
        raise ConfigError(f"--prompt-tokens {prompt_tokens} is not a length: give at least 1")
    cfg = compose_config(algo=algo, drop=drop or (), overrides=overrides or (), check=False).cfg
    _validate_without_files(cfg)
    result = plan_run(
        cfg, gpu_memory_gb * 1e9, PROMPT_TOKENS if prompt_tokens is None else prompt_tokens
    )
    title, rows = plan_rows(result)
    limit = 60.0 * float(cfg.launcher.slurm.time_min)
    rows += budget_rows(attempt_times(result, cfg), limit, _duration)
    rows.append(_cpus_row(cfg))
    print_table(title, (Col("quantity"), Col("value", justify="right"), Col("how")), rows)
    stdout.print(_verdict(result), highlight=False, soft_wrap=True)


# a plan's GPU where none is given or present: an A100/H100 80GB
DEFAULT_GPU_GB = 80.0


def _this_gpu_gb() -> float | None:
    """Returns the total memory of this machine's smallest visible GPU in GB (as the pre-flight
    check measures a run against it), None without CUDA."""
    import torch

    from vapo_lab.config.plan import smallest_gpu

    if not torch.cuda.is_available():
        return None
    return smallest_gpu()[1].total_memory / 1e9


def _validate_without_files(cfg: object) -> None:
    """Raises ConfigError for ``validate``'s problems of ``cfg``, less the checkpoint and data files
    a plan does not read (model.path, task.train_path are only required to train)."""
    from omegaconf import OmegaConf, open_dict

    from vapo_lab.config.validate import validate
    from vapo_lab.errors import ConfigError

    probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    with open_dict(probe):
        probe.model.path = probe.model.path or "(not read by a plan)"
        probe.task.train_path = probe.task.train_path or "(not read by a plan)"
    problems = validate(probe)
    if problems:
        raise ConfigError("\n".join(problems))


def plan_rows(p: RunPlan) -> tuple[str, list[tuple[str, str, str]]]:
    """Returns (title, rows of quantity / value / how) of plan ``p``."""
    from vapo_lab.config.attempt import write_seconds
    from vapo_lab.models.counts import non_embedding_params, state_bytes_per_param
    from vapo_lab.models.footprint import GB

    fp, s, shape = p.footprint, p.setup, p.shape
    world = s.world if s.strategy == "fsdp" else 1

    def big(n: int) -> str:
        return f"{n / 1e9:.2f}B ({n:,})" if n >= 1e8 else f"{n / 1e6:.2f}M ({n:,})"

    per = "/ N" if world > 1 else "unsharded"
    w, g, o = state_bytes_per_param(s.strategy, s.dtype)
    title = (
        f"Resource plan: {p.model}, {s.strategy} over N = {world} rank{'s' if world > 1 else ''}, "
        f"{s.dtype}, {p.memory / GB:g} GB a GPU"
    )
    shape_text = (
        f"h {shape.hidden_size}, L {shape.num_layers}, "
        f"heads {shape.num_heads}/{shape.num_kv_heads} kv, "
        f"d {shape.head_dim}, i {shape.intermediate_size}, V {shape.vocab_size}, "
        f"{'tied' if shape.tie_word_embeddings else 'untied'}"
    )
    rows = [
        ("model shape", shape_text, p.model),
        (
            "parameters: actor",
            big(fp.actor_params),
            "V·h + L·layer + h" + ("" if shape.tie_word_embeddings else " + V·h (lm_head)"),
        ),
        ("  non-embedding", big(non_embedding_params(shape)), "L·layer + h"),
        (
            "parameters: critic",
            big(fp.critic_params) if fp.critic_params else "none",
            "backbone + value head (h + 1)"
            if fp.critic_params
            else "algo.advantage=group: no critic",
        ),
        (
            "parameters: reference",
            big(fp.reference_params) if fp.reference_params else "none",
            "a frozen copy of the actor (kl.coef > 0)" if fp.reference_params else "kl.coef = 0",
        ),
        (
            "tokens per sequence s",
            f"{fp.sequence:,}",
            f"prompt ~{s.prompt_tokens} + rollout.max_new_tokens "
            f"{s.max_new_tokens}, at most the context {shape.max_position_embeddings:,}",
        ),
        (
            "tokens per step",
            f"{fp.generated_tokens:,} generated; {fp.step_tokens:,} in all",
            f"{s.responses_per_step:,} responses x max_new_tokens; x s",
        ),
        ("responses per rank", f"{fp.responses_per_rank:,}", "ceil(B / N)"),
        (
            "tokens a pass",
            f"{fp.pass_tokens:,}",
            "max(s, min(max_tokens_per_micro_batch, s x min(mini_batch_size, responses a rank)))",
        ),
        ("weights", _size(fp.weights), f"{w} B/param x (actor + critic) {per}"),
        ("gradients", _size(fp.gradients), f"{g} B/param {per}"),
        ("optimizer state", _size(fp.optimizer), f"{o} B/param (AdamW m, v) {per}"),
    ]
    if fp.reference_params:
        rows.append(("reference weights", _size(fp.reference), f"{w} B/param {per}"))
    if fp.gathered:
        rows.append(
            (
                "gathered units (transient)",
                _size(fp.gathered),
                "FSDP root + 2 layers in the compute dtype",
            )
        )
    if fp.replica:
        rows.append(
            ("sampling replica", _size(fp.replica), "builtin under fsdp: the actor, unsharded")
        )
    ckpt = "on" if s.gradient_checkpointing else "off"
    rows += [
        (
            "activations: actor, checkpointing off",
            _size(fp.actor_activations_full),
            "a pass's peak, tensor by tensor as autograd keeps them, log-probs included "
            "(measured on CPU: 0.97-1.05)",
        ),
        (
            "activations: actor, checkpointing on",
            _size(fp.actor_activations_ckpt),
            "each layer's input + one layer recomputed, or the log-prob pass",
        ),
        (
            "  of which log-probs",
            _size(fp.logprob),
            f"LM head over chunks of {s.logprob_chunk or 'all'} tokens "
            "(algo.lm.head_logprobs_and_entropy)",
        ),
    ]
    if fp.critic_params:
        rows += [
            (
                "activations: critic, checkpointing off",
                _size(fp.critic_activations_full),
                "the same, a value head",
            ),
            (
                "activations: critic, checkpointing on",
                _size(fp.critic_activations_ckpt),
                "the same, checkpointed",
            ),
        ]
    rows += [
        (
            "KV cache per sequence",
            _size(fp.kv_per_sequence),
            "2·L·kv·d·bytes·s"
            + (f" / tp {s.tensor_parallel_size}" if fp.vllm and s.tensor_parallel_size > 1 else ""),
        ),
        (
            "KV cache, a rank's responses at once",
            _size(fp.kv_cache),
            f"x {fp.responses_per_rank:,}",
        ),
    ]
    if fp.vllm:
        rows += [
            ("vLLM weights a GPU", _size(fp.engine_weights), "actor in the compute dtype / tp"),
            (
                "vLLM share a GPU",
                _size(fp.engine_memory),
                f"rollout.vllm.gpu_memory_utilization {fp.engine_memory / p.memory:g}"
                f" ({'asleep' if fp.engine_sleeps else 'kept'} in the update)",
            ),
            (
                "  sequences decoded at once",
                f"{fp.sequences_at_once:,} of {fp.requests_per_engine:,} requests",
                "(share - weights) / KV per sequence, of an engine's t ranks' responses; "
                "vLLM queues the rest",
            ),
        ]
    else:
        rows.append(
            (
                "  sequences decoded at once",
                f"{fp.sequences_at_once:,} of {fp.requests_per_engine:,} requests",
                "the built-in sampler's batch (<= 256)",
            )
        )
    headroom = f"tensors x {fp.headroom:g} (allocator headroom)" if fp.headroom != 1 else "tensors"
    for phase in fp.phases:
        engine = f" + vLLM {_size(phase.engine)}" if phase.engine else ""
        rows.append(
            (
                f"phase: {phase.name}"
                + (f" (checkpointing {ckpt})" if phase.name == "update" else ""),
                _size(phase.need(fp.headroom)),
                f"{phase.how}: {_size(phase.tensors)}{engine}",
            )
        )
    if fp.reserve:
        rows.append(("CUDA context + NCCL buffers", _size(fp.reserve), _reserve_how(p)))
    largest = fp.largest_phase
    reserve = " + the CUDA context and NCCL buffers" if fp.reserve else ""
    rows += [
        (
            "need a GPU",
            _size(fp.need),
            f"the largest phase ({largest.name if largest else '-'}): {headroom} + vLLM's share"
            f"{reserve}",
        ),
        (
            "gradient updates",
            f"{fp.total_updates:,} ({fp.updates_per_step} a step)",
            f"trainer.total_steps {fp.total_steps:,} rollout steps x ceil(responses / "
            "mini_batch_size) x ppo_epochs",
        ),
        (
            "host memory a node",
            _size(fp.host_per_node),
            "pinned offload of each rank's state, vLLM's weights asleep at level 1, rank 0's "
            "critic-cache write (beyond the processes' own)",
        ),
        (
            "checkpoint a save",
            f"{_size(fp.checkpoint_bytes)}, ~{_duration(write_seconds(p))} to write",
            f"12 B/param (float32 weights, AdamW m, v) x (actor + critic); "
            f"{p.hardware.write_bandwidth / 1e9:g} GB/s a node (an assumption)"
            + (f"; every {fp.save_every} steps" if fp.save_every else ""),
        ),
        (
            "time: a decoding step",
            f"{fp.decode_step_seconds * 1e3:,.1f} ms",
            f"(weights + KV cache read) / ({p.hardware.bandwidth / 1e12:g} TB/s "
            f"x {p.hardware.bandwidth_share:g})",
        ),
        (
            "time: rollout a step",
            _duration(fp.rollout_seconds),
            "ceil(requests / at once) x max_new_tokens decoding steps "
            "(every response at full length)",
        ),
        (
            "time: update a step",
            _duration(fp.update_seconds),
            f"(6-8 P + attention) FLOPs a token / ({p.hardware.flops / 1e12:g} TFLOP/s "
            f"x {p.hardware.flops_share:g})",
        ),
        (
            "time: an evaluation",
            _duration(fp.eval_seconds),
            f"{p.setup.eval_responses:,} held-out responses spread over the ranks: "
            f"ceil({fp.eval_requests_per_engine:,} requests an engine / "
            f"{fp.eval_at_once:,} at once) x max_new_tokens decoding steps",
        ),
    ]
    return title, rows


def _reserve_how(p: RunPlan) -> str:
    """Returns how the reserve a CUDA rank holds beyond its tensors is made up
    (``models.footprint.gpu_reserve``)."""
    from vapo_lab.models.footprint import (
        CUDA_CONTEXT_BYTES,
        GB,
        NCCL_COMMUNICATOR_BYTES,
        nccl_groups,
        shard_ranks,
    )

    s = p.setup
    groups = nccl_groups(
        s.world if s.strategy == "fsdp" else 1,
        s.tensor_parallel_size if s.engine == "vllm" else 1,
        shard_ranks(s),
    )
    nccl = (
        f" + {len(groups)} NCCL communicator{'s' if len(groups) > 1 else ''} x "
        f"{NCCL_COMMUNICATOR_BYTES / GB:.2f} GB ({', '.join(groups)})"
        if groups
        else ""
    )
    return f"the CUDA context {CUDA_CONTEXT_BYTES / GB:.2f} GB{nccl}: outside torch's allocator"


def _cpus_row(cfg: Any) -> tuple[str, str, str]:
    """Returns the plan's row of the CPUs a Slurm rank asks for (``launch.slurm.group_cpus``)."""
    from omegaconf import OmegaConf

    from vapo_lab.launch.slurm import VLLM_CPUS_PER_RANK, group_cpus

    settings = OmegaConf.to_container(cfg.launcher.slurm, resolve=True)
    config = OmegaConf.to_container(cfg, resolve=True)
    return (
        "Slurm CPUs a rank",
        str(group_cpus([config], settings)),
        f"launcher.slurm.cpus_per_task; null: {VLLM_CPUS_PER_RANK} where vLLM samples (its "
        "scheduler runs in the rank's process beside math-verify's grading and the tokenisers)",
    )


def _duration(seconds: float) -> str:
    """Returns ``seconds`` as hours, minutes or seconds ("never": a rollout that cannot start)."""
    if seconds == float("inf"):
        return "never (no sequence fits)"
    if seconds >= 3600:
        return f"{seconds / 3600:,.2f} h"
    return f"{seconds / 60:,.1f} min" if seconds >= 60 else f"{seconds:,.1f} s"


def _size(n: float) -> str:
    """Returns ``n`` bytes in GB (10^9), or in MB below 1 GB so that small runs do not read 0.00."""
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.2f} MB"


def _verdict(p: RunPlan) -> str:
    """Returns the closing lines: fits or not, fewest GPUs that fit, the vLLM share that works."""
    from vapo_lab.config.plan import fastest_within, fewest_ranks, fixes
    from vapo_lab.models.footprint import (
        ALLOCATOR_HEADROOM,
        CUDA_CONTEXT_BYTES,
        GB,
        NCCL_COMMUNICATOR_BYTES,
        share_bound,
    )

    fp, s = p.footprint, p.setup
    world = s.world if s.strategy == "fsdp" else 1
    memory = p.memory
    largest = fp.largest_phase
    lines = [
        f"fits {memory / GB:g} GB GPUs at N = {world}: {'yes' if fp.fits(memory) else 'no'} "
        f"(needs {fp.need / GB:.2f} GB a GPU, in {largest.name if largest else 'its largest phase'}"
        + (f", torch's tensors x {fp.headroom:g}" if fp.headroom != 1 else "")
        + (f", + {fp.reserve / GB:.2f} GB for the CUDA context and NCCL" if fp.reserve else "")
        + ")"
    ]
    fewest = fewest_ranks(p)
    where = f"trainer.strategy=fsdp; N divides the {p.prompts_per_step} prompts per step"
    if fewest is not None:
        lines.append(f"fewest GPUs that fit: {fewest} ({where})")
    elif fp.vllm and fewest_ranks(p, engine_at_minimum=True) is not None:
        lines.append(
            f"fewest GPUs that fit: {fewest_ranks(p, engine_at_minimum=True)} with "
            f"rollout.vllm.gpu_memory_utilization="
            f"{share_bound(fp.engine_minimum / memory, upper=False):.2f}, "
            "vLLM's least; none at "
            f"{fp.engine_memory / memory:g} ({where})"
        )
    else:
        lines.append(
            f"fewest GPUs that fit: none ({where}): what does not shrink with N is too large (the "
            "activations of a micro-batch, the gathered units, the sampling engine)"
        )
    lines.append(
        f"estimated step at N = {world}: {_duration(fp.step_seconds)} (rollout "
        f"{_duration(fp.rollout_seconds)}, update {_duration(fp.update_seconds)})"
    )
    hour = fastest_within(p, 3600.0)
    if hour is not None:
        n, change, seconds = hour
        extra = "".join(
            f" {k}={str(v).lower() if isinstance(v, bool) else f'{v:g}'}" for k, v in change.items()
        )
        lines.append(
            "smallest setting whose step takes under an hour: "
            f"N = {n}{' with' + extra if extra else ''} "
            f"(estimated {_duration(seconds)} a step)"
        )
    else:
        lines.append(f"smallest setting whose step takes under an hour: none that fits ({where})")
    lines.append(
        f"rollout steps {fp.total_steps:,} = {fp.total_updates:,} gradient updates "
        f"({fp.updates_per_step} a step; the paper's 5,000 steps are gradient updates)"
    )
    timeout = p.collective_timeout
    bound = max(fp.rollout_seconds, fp.eval_seconds)
    verdict = "enough" if bound <= timeout else "too short: raise it"
    if bound == float("inf"):
        verdict = "no bound (no sequence fits)"
    lines.append(
        f"trainer.collective_timeout_min {timeout / 60:g} against a rollout's upper bound "
        f"{_duration(fp.rollout_seconds)} and an evaluation's {_duration(fp.eval_seconds)} "
        f"(ranks wait for the slowest engine): {verdict}"
    )
    if fp.vllm:
        # the rest of the GPU holds what torch keeps in each phase vLLM is awake in
        rest = max(
            (ph.tensors * fp.headroom for ph in fp.phases if ph.engine),
            default=0.0,
        )
        low = share_bound(fp.engine_minimum / memory, upper=False)
        high = share_bound((memory - rest - fp.reserve) / memory, upper=True)
        exact = (fp.engine_minimum / memory, (memory - rest - fp.reserve) / memory)
        works = exact[0] <= fp.engine_memory / memory <= exact[1]
        verdict = "works" if works else "does not work"
        lines.append(
            f"rollout.vllm.gpu_memory_utilization must be in [{low:.2f}, {high:.2f}] "
            f"at N = {world} "
            f"(weights + one sequence's KV cache; the rest of the GPU for training"
            f"{', the CUDA context and NCCL' if fp.reserve else ''}): "
            f"{fp.engine_memory / memory:g} {verdict}"
        )
    if not fp.fits(memory):
        lines.append(f"to fit, {fixes(p)}")
    lines.append(
        "estimates: ZeRO §3.1 (16 B/param mixed-precision Adam), the activations autograd keeps "
        "for Qwen2 tensor by tensor and the chunked log-prob pass "
        "(both within 5% of CPU measurements; "
        "attention scores not stored, as flash attention); torch's tensors x "
        f"{ALLOCATOR_HEADROOM:g} on GPUs for the caching allocator (reserved against allocated, "
        "measured: docs/gpu-runs); on GPUs a rank's CUDA context "
        f"({CUDA_CONTEXT_BYTES / GB:g} GB) and each NCCL communicator "
        f"({NCCL_COMMUNICATOR_BYTES / GB:g} GB; pytorch/pytorch#86509, NVIDIA/nccl#964). "
        "Times: a roofline on an H100 at the stated shares of its peak "
        "(assumptions, models.footprint.Hardware), an upper bound for the rollout"
    )
    return "\n".join(lines)
