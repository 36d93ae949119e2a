"""Pre-flight checks: the folders and the tracking store a command will write, checked before any
compute.

A run writes its folder under ``output_dir``, the shared caches under ``./.vapo_cache`` and, with
``tracking=mlflow``, an MLflow store (``./mlflow.db`` by default). Each of these failing after a
two-minute base build is a waste; here each is tried first, cheaply, and nothing is left behind:
a folder is probed by creating and removing one temporary file in it (or in its nearest existing
parent, where the folder does not exist yet), a server by its ``/health`` endpoint. Every check
returns its problems as lines (empty when fine); ``require`` raises them all at once.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vapo_lab.algo.lm import default_chunk_tokens
from vapo_lab.config.schema import RM_INITS
from vapo_lab.errors import ConfigError, VapoLabError
from vapo_lab.models.footprint import (
    ALLOCATOR_HEADROOM,
    GB,
    Footprint,
    Hardware,
    Setup,
    estimate,
    smallest_world,
)
from vapo_lab.models.shapes import KNOWN_ARCHS, Shape, known_arch, read_shape
from vapo_lab.runs.folder import run_name_taken


@dataclass(frozen=True)
class Need:
    """A path a command will write: ``what`` names it as the user set it, ``fix`` says how to move
    it."""

    path: Path
    what: str  # e.g. "output_dir=runs"
    fix: str  # e.g. "set output_dir=/a/writable/folder"


def unwritable(path: str | Path) -> tuple[Path, str] | None:
    """Returns (the folder that blocks it, why) when ``path`` (a folder, made if missing) cannot be
    written, else None. Creates and removes one temporary file in ``path`` or its nearest existing
    parent."""
    target = Path(path).absolute()
    folder = target
    while not folder.exists() and folder != folder.parent:  # the nearest existing parent
        folder = folder.parent
    if not folder.is_dir():
        return folder, f"{folder} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".vapo-lab-probe-", dir=folder)
    except OSError as e:
        return folder, f"{folder} is not writable ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def writable_problems(needs: Sequence[Need]) -> list[str]:
    """Returns one line per folder that blocks some of ``needs``, naming what goes there and each
    fix."""
    blocked: dict[Path, tuple[str, list[Need]]] = {}
    for need in needs:
        found = unwritable(need.path)
        if found is not None:
            blocked.setdefault(found[0], (found[1], []))[1].append(need)
    lines = []
    for folder, (why, group) in blocked.items():
        fixes = list(dict.fromkeys(n.fix for n in group))
        if len(group) == 1:
            lines.append(f"{group[0].what} cannot be written: {why}; {fixes[0]}")
        else:
            whats = ", ".join(n.what for n in group[:-1]) + f" and {group[-1].what}"
            lines.append(f"{why}, and {whats} are written there: {'; '.join(fixes)}")
    return lines


def require(problems: Sequence[str], error: type[VapoLabError] = ConfigError) -> None:
    """Raises ``error`` with every problem, one per line, when there is any."""
    if problems:
        raise error("\n".join(problems))


# -- the tracking store --------------------------------------------------------------------------
def store_path(uri: str) -> tuple[str, Path | None]:
    """Returns (kind, local path) of a resolved MLflow tracking URI: kind sqlite (the database
    file), file (the store folder), server (http/https; no path) or other (not checked)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        return "server", None
    if parsed.scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db (SQLAlchemy); sqlite:// is in memory
        rest = uri[len("sqlite://") :].split("?", 1)[0]
        return (
            ("sqlite", Path(rest[1:]))
            if rest.startswith("/") and len(rest) > 1
            else ("other", None)
        )
    if parsed.scheme == "file":
        return "file", Path(parsed.path)
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (a Windows drive letter too)
        return "file", Path(uri)
    return "other", None


def tracking_problems(
    uri: str | None, key: str = "tracking.uri", must_exist: bool = False, timeout: float = 3.0
) -> list[str]:
    """Returns the problems of the MLflow store ``uri`` (None: $MLFLOW_TRACKING_URI, else
    ./mlflow.db).

    Args:
        uri: the tracking URI as given.
        key: how the user sets it (tracking.uri, --tracking-uri), named in the fix.
        must_exist: for reading (``vapo-lab report``): a local store must already exist; it is
            never created. Otherwise a local store must be creatable and writable.
        timeout: seconds to wait for a server's /health.
    """
    from vapo_lab.track.mlflow_tracker import TrackingError, check_server, resolve_tracking_uri

    resolved = resolve_tracking_uri(uri)
    shown = (
        (f"{key} {resolved}" if key.startswith("--") else f"{key}={resolved}")
        if uri
        else f"the default tracking store {resolved}"
    )
    kind, path = store_path(resolved)
    if kind == "server":
        try:
            check_server(resolved, timeout=timeout)
        except TrackingError as e:
            if key == "tracking.uri":
                return [str(e)]
            return [
                str(e).replace("set tracking.uri", f"give {key}").replace(", or tracking=none", "")
            ]
        return []
    if path is None:
        return []
    if must_exist:
        if kind == "sqlite" and not path.is_file():
            return [
                f"{shown} does not exist (no file {path.absolute()}): give --tracking-uri the "
                "store the runs "
                "logged to (their run.json says which), e.g. sqlite:///mlflow.db in the folder "
                "they ran from"
            ]
        if kind == "file" and not path.is_dir():
            return [
                f"{shown} does not exist (no folder {path.absolute()}): give --tracking-uri the "
                "store the "
                "runs logged to (their run.json says which)"
            ]
        return []
    fix = (
        (
            f"set {key} to a store in a writable folder (e.g. {key}=sqlite:////tmp/mlflow.db), "
            "or tracking=none"
        )
        if key == "tracking.uri"
        else f"give {key} a store in a writable folder"
    )
    if kind == "sqlite" and path.exists() and not path.is_file():
        return [f"{shown} is not a database: {path} is a folder; {fix}"]
    if kind == "sqlite" and path.is_file() and not os.access(path, os.R_OK | os.W_OK):
        return [f"{shown} cannot be written: {path} is read-only; {fix}"]
    # SQLite also writes a journal beside the database; MLflow makes missing parent folders
    return writable_problems([Need(path.parent if kind == "sqlite" else path, shown, fix)])


# -- a training run ------------------------------------------------------------------------------
def run_problems(cfg: Any, cache_dir: str | Path) -> list[str]:
    """Returns the problems of where the run ``cfg`` will write: its folder (under ``output_dir``,
    or ``resume``), ``cache_dir`` (the shared caches, relative to the working directory) and the
    tracking store; folders that share a blocked parent are named on one line."""
    folders, tracking = _run_problems(cfg, cache_dir)
    return folders + tracking


def _run_problems(cfg: Any, cache_dir: str | Path) -> tuple[list[str], list[str]]:
    """Returns (problems of folders, including a local store's, problems of a tracking server)."""
    needs = [
        Need(Path(cache_dir), f"the caches in {cache_dir}", "run vapo-lab from a writable folder")
    ]
    if cfg.resume:
        needs.append(
            Need(
                Path(cfg.resume),
                f"resume={cfg.resume}",
                "copy the run to a writable folder and resume it there",
            )
        )
    else:
        needs.append(
            Need(
                Path(cfg.output_dir),
                f"output_dir={cfg.output_dir}",
                "set output_dir=/a/writable/folder",
            )
        )
    store: list[str] = []  # an existing database's own problems
    name = cfg.get("run_name")
    if not cfg.resume and name and (Path(cfg.output_dir) / name).exists():
        store.append(run_name_taken(name, Path(cfg.output_dir) / name))
    server: list[str] = []
    if cfg.tracking.backend == "mlflow":
        from vapo_lab.track.mlflow_tracker import resolve_tracking_uri

        resolved = resolve_tracking_uri(cfg.tracking.uri)
        kind, path = store_path(resolved)
        if kind == "server":
            server = tracking_problems(cfg.tracking.uri)
        elif kind == "sqlite" and path is not None and path.exists():
            store = tracking_problems(cfg.tracking.uri)
        elif path is not None:  # a local store, made on first use: its folder joins the others
            shown = (
                f"tracking.uri={resolved}" if cfg.tracking.uri else f"the MLflow store {path.name}"
            )
            needs.append(
                Need(
                    path.parent if kind == "sqlite" else path,
                    shown,
                    "set tracking.uri=sqlite:////a/writable/folder/mlflow.db, or tracking=none",
                )
            )
    return writable_problems(needs) + store, server


def check_run(cfg: Any, cache_dir: str | Path) -> None:
    """Raises ConfigError naming every place the run ``cfg`` cannot write (see ``run_problems``)
    and, when it runs on this machine (launcher=local: ``train`` and local grids), a model and batch
    its devices cannot hold (``fit_problems``); TrackingError when the only problem is a tracking
    server that does not answer. Ray and Slurm cells run on other machines, whose devices this one
    cannot see."""
    from vapo_lab.track.mlflow_tracker import TrackingError

    folders, tracking = _run_problems(cfg, cache_dir)
    if cfg.launcher.name == "local":
        folders += fit_problems(cfg)
    require(folders + tracking, ConfigError if folders else TrackingError)


# -- the devices: does the run fit them -----------------------------------------------------------
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
        sleep_level=int(v.get("sleep_level", 2)),
        total_steps=int(t.total_steps),
        save_every=int(t.save_every),
        headroom=ALLOCATOR_HEADROOM if device == "cuda" else 1.0,
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
    bound = fp.rollout_seconds
    if device == "cuda" and plan.collective_timeout < bound < math.inf:
        problems.append(
            f"trainer.collective_timeout_min={plan.collective_timeout / 60:g} is below the plan's "
            f"bound for one rollout, {fp.rollout_seconds / 60:.0f} min (ranks wait for the slowest "
            f"engine in the first collective after sampling): set "
            f"trainer.collective_timeout_min={math.ceil(fp.rollout_seconds / 60) + 10}"
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
    if largest is not None and largest.name not in ("update", "rollout"):
        headroom = f" x {fp.headroom:g}" if fp.headroom != 1 else ""
        engine = f" + vLLM's {largest.engine / GB:.1f}" if largest.engine else ""
        return (
            f"the run needs {fp.need / GB:.1f} GB a rank ({largest.name}: {largest.how}, "
            f"{largest.tensors / GB:.1f} GB{headroom}{engine})"
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
    return f"the run needs {fp.need / GB:.1f} GB a rank ({update}; {rollout})"


def fixes(plan: RunPlan) -> str:
    """Returns the fixes that apply to ``plan``, most effective first, as one clause."""
    fp, s = plan.footprint, plan.setup
    fixes = []
    share = fp.engine_minimum / plan.memory
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


def check_fits(cfg: Any) -> None:
    """Raises ConfigError (one line: need, have, fixes) when run ``cfg`` cannot fit this machine's
    devices."""
    require(fit_problems(cfg))


def require_writable(
    path: str | Path, what: str, fix: str, error: type[VapoLabError] = ConfigError
) -> None:
    """Raises ``error`` when the folder ``path`` cannot be made or written, naming ``what`` and
    ``fix``."""
    require(writable_problems([Need(Path(path), what, fix)]), error)


__all__ = [
    "BUILTIN_ROWS",
    "PROMPT_TOKENS",
    "Need",
    "RunPlan",
    "check_fits",
    "check_run",
    "device_memory",
    "fewest_ranks",
    "fit_problems",
    "fixes",
    "model_shape",
    "plan_run",
    "require",
    "require_writable",
    "run_problems",
    "store_path",
    "tracking_problems",
    "unwritable",
    "writable_problems",
]
