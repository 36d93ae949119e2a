"""One training run: set up models, data, tracking and checkpoints, then run the loop.

``train(cfg)`` is what ``vapo-lab train`` and every launcher call. A run lives in
``<output_dir>/<run name>/`` with ``config.yaml`` (resolved), ``run.json`` (tracking run id),
``metrics.jsonl`` (every logged metric, the local record that never depends on a server) and
``checkpoints/``. ``resume=<run dir>`` continues from its latest checkpoint with the same RNG
states and data position, so it logs the same metrics an uninterrupted run would.
"""

from __future__ import annotations

import copy
import json
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils import deterministic as torch_deterministic
from omegaconf import DictConfig, OmegaConf

from vapo_lab import faults
from vapo_lab.algo import dynamic_sampling_keep, explained_variance, masked_mean
from vapo_lab.components import COMPONENTS
from vapo_lab.errors import ConfigError
from vapo_lab.basemodel import build_base_for
from vapo_lab.integrity import CACHE_DIR
from vapo_lab.models.load import pick_device
from vapo_lab.models.value import ValueModel
from vapo_lab.rollout import Generate, make_engine, make_generator
from vapo_lab.tasks import build_task
from vapo_lab.track import flatten, make_tracker
from vapo_lab.runs.checkpoint import latest_checkpoint, load_state, rng_state, save_checkpoint, set_rng_state
from vapo_lab.trainer.critic_init import batched_values, build_reward_model, pretrain_critic
from vapo_lab.trainer.diagnostics import length_profile, value_bias_by_position
from vapo_lab.trainer.forward import Rows, policy_forward
from vapo_lab.runs.metrics_log import MetricsLog
from vapo_lab.rollout.prompts import encode_prompts
from vapo_lab.trainer.loop import Batch, Grader, Updater, compute_advantages



@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    run_id: str
    steps: int
    final_eval: float | None
    best_eval: float | None
    base_eval: float | None
    checkpoint: Path | None
    metrics: list[dict[str, Any]] = field(default_factory=list)


def git_commit() -> str:
    """Returns the current git commit of the working directory, or 'unknown'."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def component_tags(choices: dict[str, str]) -> dict[str, str]:
    """Returns MLflow tags for the components: each one's state and the dropped list."""
    off = [c.name for c in COMPONENTS if choices.get(c.name) == "off"]
    return {**{f"component.{c.name}": choices.get(c.name, "?") for c in COMPONENTS},
            "components_off": ",".join(off) or "none"}


class DataStream:
    """Training problems in a seeded order, epoch after epoch; its position is checkpointed."""

    def __init__(self, problems: list[Any], seed: int) -> None:
        self.problems, self.seed = problems, seed
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.problems), generator=g).tolist()

    def take(self, n: int) -> list[Any]:
        """Returns the next ``n`` problems."""
        out = []
        while len(out) < n:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self.problems[self._order[self.index]])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation()


def adamw(params: Any, lr: float, t: DictConfig) -> torch.optim.AdamW:
    """Returns AdamW over ``params`` with the trainer config's betas, eps, weight decay and kernel
    (``trainer.adam_impl``: fused, foreach or for-loop)."""
    impl = t.get("adam_impl", "fused")
    kernel = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(params, lr=lr, betas=tuple(t.adam_betas), eps=float(t.adam_eps),
                             weight_decay=float(t.weight_decay), **kernel)


def _warmup_constant(warmup: int) -> Callable[[int], float]:
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def load_policy(cfg: DictConfig, log: Callable[[str], None], progress: bool) -> tuple[Any, Any, str, dict, Path]:
    """Returns (policy, tokenizer, a cache key of the initial weights, base metrics, its directory)."""
    from vapo_lab.models.load import load_model_and_tokenizer

    if cfg.model.name == "tiny":
        base = build_base_for(cfg, progress, log=log)
        if not base.cached:
            log(f"built the base model in {base.metrics.get('build_seconds', 0):.0f}s: {base.path}")
        path, key, metrics = base.path, base.path.name, base.metrics
    else:
        path = Path(cfg.model.path)
        key, metrics = str(path.resolve()), {}
    policy, tokenizer = load_model_and_tokenizer(path, dtype=cfg.model.dtype, tokenizer_path=cfg.model.tokenizer_path,
                                                 trust_remote_code=cfg.model.trust_remote_code)
    return policy, tokenizer, key, metrics, path


def check_context(cfg: DictConfig, task: Any, tokenizer: Any, context: int | None) -> None:
    """Raises ConfigError when the longest prompt plus ``rollout.max_new_tokens`` exceeds the model's
    context of ``context`` tokens (None: unknown, not checked), naming the problem and both fixes."""
    new = int(cfg.rollout.max_new_tokens)  # >= 1: checked at compose time
    if context is None:
        return
    problems = list(task.train) + list(task.eval)
    lengths = [len(ids) for ids in encode_prompts(tokenizer, problems, cfg.model.chat_template)]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[longest] + new > context:
        raise ConfigError(
            f"the longest prompt ({lengths[longest]} tokens, problem {problems[longest].id}) plus "
            f"rollout.max_new_tokens={new} exceeds the model's context of {context} tokens: lower "
            "rollout.max_new_tokens, drop long problems, or use a model with a longer context"
            + (" (model.arch.max_position_embeddings)" if cfg.model.name == "tiny" else ""))


@torch.no_grad()
def evaluate(generate: Generate, tokenizer: Any, task: Any, grader: Grader, cfg: DictConfig,
             seed: int) -> dict[str, float]:
    """Returns held-out avg@k (mean per-sample accuracy), pass@k and mean length on the eval split."""
    k = int(cfg.rollout.eval_samples)
    problems = list(task.eval)
    gen = torch.Generator().manual_seed(seed)
    s = generate(encode_prompts(tokenizer, problems, cfg.model.chat_template), k,
                 float(cfg.rollout.eval_temperature), float(cfg.rollout.eval_top_p), gen)
    rep = [p for p in problems for _ in range(k)]
    _, correct, _ = grader(s, rep)
    per_problem = correct.float().view(len(problems), k)
    return {f"eval/avg_at_{k}": float(per_problem.mean()),
            f"eval/pass_at_{k}": float((per_problem.sum(-1) > 0).float().mean()),
            "eval/response_length": float(s.lengths.float().mean()),
            "eval/truncated_frac": float(s.truncated.float().mean())}


class Run:
    """Everything one training run holds."""

    def __init__(self, cfg: DictConfig, choices: dict[str, str] | None = None, progress: bool = True,
                 log: Callable[[str], None] = print, command: str = "", tags: dict[str, str] | None = None,
                 parent_run_id: str | None = None) -> None:
        self.cfg, self.log, self.progress = cfg, log, progress
        self.choices = choices or {}
        if cfg.trainer.threads:
            torch.set_num_threads(int(cfg.trainer.threads))
        self.device = pick_device(cfg.trainer.device)
        if self.device.type == "cpu":
            # some CPU backward kernels accumulate in an order that varies run to run; this picks
            # their deterministic versions (conf/trainer/default.yaml: deterministic)
            torch.use_deterministic_algorithms(bool(cfg.trainer.deterministic), warn_only=True)
            # the mode also fills every new tensor with NaN by default (to expose reads of
            # uninitialised memory): a memory pass per op output that buys no determinism here
            torch_deterministic.fill_uninitialized_memory = False
        if cfg.rollout.backend == "vllm":  # fail before any compute when vLLM or a GPU is missing
            from vapo_lab.rollout.vllm_backend import require_vllm

            require_vllm()
        resume_dir = Path(cfg.resume) if cfg.resume else None
        if resume_dir is not None and not (resume_dir / "run.json").is_file():
            raise ConfigError(f"resume={cfg.resume} is not a vapo-lab run directory (no run.json): "
                              "give the folder a run printed at its start, e.g. runs/vapo-seed0-...")
        random.seed(int(cfg.seed))
        torch.manual_seed(int(cfg.seed))

        self.task = build_task(cfg.task.name, **self._task_kwargs())
        if cfg.model.name == "tiny":  # before the base build: its tokenizer is the task's vocabulary
            from vapo_lab.models.tokenizer import build_tokenizer

            check_context(cfg, self.task, build_tokenizer(self.task.vocabulary()), int(cfg.model.arch.max_position_embeddings))
        self.policy, self.tokenizer, policy_key, self.base_metrics, policy_path = load_policy(cfg, log, progress)
        if cfg.model.name != "tiny":
            check_context(cfg, self.task, self.tokenizer, getattr(self.policy.config, "max_position_embeddings", None))
        self.policy.to(self.device).eval()
        tok = self.tokenizer
        self.eos_ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (self.eos_ids or [0])[0]
        self.engine = make_engine(cfg.rollout.backend, policy_path, cfg)
        self.generate = make_generator(cfg.rollout.backend, self.policy, int(cfg.rollout.max_new_tokens),
                                       self.eos_ids, self.pad_id, self.engine)
        self.encode = lambda problems: encode_prompts(tok, problems, cfg.model.chat_template)
        self.grader = Grader(self.task, tok, float(cfg.reward.correct), float(cfg.reward.wrong),
                             cfg.reward.overlong)
        self.data = DataStream(self.task.train, int(cfg.seed))
        self.ref = None
        if cfg.kl.coef > 0:
            self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)

        self.gen_rollout = torch.Generator().manual_seed(int(cfg.seed))
        self.gen_update = torch.Generator().manual_seed(int(cfg.seed) + 7)
        t = cfg.trainer
        self.actor_opt = adamw(self.policy.parameters(), float(t.actor_lr), t)
        self.actor_sched = torch.optim.lr_scheduler.LambdaLR(self.actor_opt, _warmup_constant(int(t.warmup_steps)))
        self.critic = self.critic_opt = self.critic_sched = None
        self.pretrain_info: dict[str, Any] = {}

        self.run_dir = resume_dir or self._new_run_dir()
        created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tracker = make_tracker(cfg.tracking.backend, cfg.tracking.uri, cfg.tracking.experiment,
                                    cfg.tracking.spool_dir, log=self.log)
        run_json = self.run_dir / "run.json"
        previous = json.loads(run_json.read_text()) if resume_dir else {}
        tags = {"algo": cfg.algo.name, "seed": str(cfg.seed), "experiment": cfg.tracking.experiment,
                "scale": cfg.scale.name, "git_commit": git_commit(), "run_dir": str(self.run_dir),
                **component_tags(self.choices), **(tags or {})}
        params = {k: v for k, v in flatten(OmegaConf.to_container(cfg, resolve=True)).items()}
        params["command"] = command or " ".join(sys.argv)
        try:
            self.run_id = self.tracker.start(self.run_dir.name, tags, params,
                                             resume_run_id=previous.get("run_id"), parent_run_id=parent_run_id)
        except BaseException:
            if created:  # nothing of this run exists anywhere: leave no empty folder behind
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        try:
            self._setup(cfg, resume_dir, run_json, params, policy_key)
        except BaseException as e:
            self._close("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED", e)
            raise

    def _setup(self, cfg: DictConfig, resume_dir: Path | None, run_json: Path, params: dict[str, Any],
               policy_key: str) -> None:
        """The part of setting up that runs inside the tracking run (a failure here is recorded)."""
        if not resume_dir:
            run_json.write_text(json.dumps({"run_id": self.run_id, "tracking_uri": getattr(self.tracker, "uri", "none"),
                                            "command": params["command"], "choices": self.choices}, indent=2))
            (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            self.tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        self.metrics_log = MetricsLog(self.run_dir / "metrics.jsonl", warn=self.log)
        if resume_dir:  # steps a killed process wrote locally but never got to send
            self.tracker.backfill(self.metrics_log.records())

        if cfg.algo.advantage == "gae":
            self._init_critic(policy_key)
        self.updater = Updater(cfg, self.policy, self.critic, self.ref, self.actor_opt, self.critic_opt,
                               self.gen_update)
        self.step = 0
        self.best_eval: float | None = None
        self._warned_lambda = False
        if resume_dir:
            self._resume()

    # -- setup ---------------------------------------------------------------------------------
    def _task_kwargs(self) -> dict[str, Any]:
        c = self.cfg.task
        kw: dict[str, Any] = {"seed": int(c.seed), "n_train": int(c.n_train), "n_eval": int(c.n_eval),
                              **dict(c.options)}
        if c.name != "arith":
            kw.update(train_path=c.train_path, eval_path=c.eval_path, problem_key=c.problem_key,
                      answer_key=c.answer_key, prompt_template=c.prompt_template)
        return kw

    def _new_run_dir(self) -> Path:
        name = self.cfg.run_name or f"{self.cfg.algo.name}-seed{self.cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        path = Path(self.cfg.output_dir) / name
        i = 1
        while path.exists():
            i += 1
            path = Path(self.cfg.output_dir) / f"{name}-{i}"
        return path

    def _init_critic(self, policy_key: str) -> None:
        cfg = self.cfg
        init = cfg.critic.init
        draw_rng = DataStream(self.task.train, int(cfg.task.seed) + 99)
        if init == "reward_model":
            rm_path = build_reward_model(self.policy, self.generate, policy_key, cfg, draw_rng.take, self.grader,
                                         self.encode, CACHE_DIR, log=self.log)
            critic, critic_key = ValueModel.load(rm_path), f"rm:{rm_path.name}"
        elif init == "policy":
            critic, critic_key = ValueModel.from_causal_lm(self.policy), f"policy:{policy_key}"
        else:
            critic, critic_key = ValueModel.random_like(self.policy, seed=int(cfg.seed)), f"random:{policy_key}"
        critic.to(self.device).eval()
        if cfg.critic.pretrain.enabled:
            def updater_factory(c: ValueModel) -> Updater:
                opt = adamw(c.parameters(), float(cfg.trainer.critic_lr), cfg.trainer)
                return Updater(cfg, self.policy, c, None, self.actor_opt, opt, torch.Generator().manual_seed(3))

            critic, self.pretrain_info = pretrain_critic(
                critic, critic_key, self.generate, cfg, DataStream(self.task.train, int(cfg.task.seed) + 5).take,
                self.grader, self.encode, updater_factory, CACHE_DIR, self._log_pretrain, log=self.log)
            critic.to(self.device).eval()
        self.critic = critic
        t = cfg.trainer
        self.critic_opt = adamw(critic.parameters(), float(t.critic_lr), t)
        self.critic_sched = torch.optim.lr_scheduler.LambdaLR(self.critic_opt, _warmup_constant(int(t.warmup_steps)))

    def _log_pretrain(self, metrics: dict[str, float], step: int) -> None:
        self.log_metrics(metrics, step)

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self) -> Path:
        modules: dict[str, Any] = {"policy": self.policy}
        if self.critic is not None:
            modules["critic"] = self.critic
        state = {
            "actor_opt": self.actor_opt.state_dict(), "actor_sched": self.actor_sched.state_dict(),
            "critic_opt": self.critic_opt.state_dict() if self.critic_opt else None,
            "critic_sched": self.critic_sched.state_dict() if self.critic_sched else None,
            "rng": rng_state({"rollout": self.gen_rollout, "update": self.gen_update}),
            "data": self.data.state(), "best_eval": self.best_eval,
        }
        return save_checkpoint(self.run_dir / "checkpoints", self.step, modules, state,
                               before_commit=lambda: faults.point("checkpoint", self.step))

    def _resume(self) -> None:
        path = latest_checkpoint(self.run_dir / "checkpoints", warn=self.log)
        if path is None:
            self.log(f"no usable checkpoint in {self.run_dir}: starting from step 0")
            return
        from transformers import AutoModelForCausalLM

        state = load_state(path)  # first: it refuses an unsafe file before any model is touched
        policy = AutoModelForCausalLM.from_pretrained(path / "policy", dtype=self.policy.dtype, use_safetensors=True)
        self.policy.load_state_dict(policy.state_dict())
        if self.critic is not None:
            self.critic.load_state_dict(ValueModel.load(path / "critic").state_dict())
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic_opt is not None:
            self.critic_opt.load_state_dict(state["critic_opt"])
            self.critic_sched.load_state_dict(state["critic_sched"])
        set_rng_state(state["rng"], {"rollout": self.gen_rollout, "update": self.gen_update})
        self.data.load(state["data"])
        self.step, self.best_eval = int(state["step"]), state["best_eval"]
        if self.engine is not None:
            self.engine.push_weights(self.policy)
        self.log(f"resumed {self.run_dir} at step {self.step}")

    # -- the loop ------------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Records ``metrics`` at ``step`` in metrics.jsonl, then the tracker; a step already
        recorded before an interruption is not recorded again (see ``MetricsLog``)."""
        now = int(time.time() * 1000)
        if self.metrics_log.add(step, metrics, now):
            self.tracker.log_metrics(metrics, step, now)

    def _close(self, status: str, error: BaseException | None = None) -> None:
        """Ends the tracking run as ``status`` (FINISHED, FAILED, KILLED); a run that did not finish
        says why in ``failure.txt`` in its folder (``resume=<run dir>`` continues it)."""
        failure = self.run_dir / "failure.txt"
        if error is not None:
            import traceback

            what = "interrupted" if status == "KILLED" else "failed"
            failure.write_text(
                f"{what} at step {getattr(self, 'step', 0)} on {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{type(error).__name__}: {error}\ncontinue it with: vapo-lab train resume={self.run_dir}\n\n"
                + "".join(traceback.format_exception(error)), encoding="utf-8")
        elif failure.exists():
            failure.unlink()
        spool = self.tracker.finish(status)
        if spool is not None:
            self.log(f"tracking server unreachable: metrics kept in {spool} (replayed on resume)")

    def collect(self) -> tuple[Batch, dict[str, float]]:
        """Returns one step's graded experience (DAPO: only groups with mixed rewards)."""
        cfg = self.cfg
        n = int(cfg.rollout.n_samples)
        want = int(cfg.rollout.responses_per_step) // n
        kept_rows: list[Rows] = []
        kept: list[tuple[Any, ...]] = []
        have, rounds, generated = 0, 0, 0
        info: dict[str, float] = {}
        while True:
            problems = self.data.take(want if rounds == 0 else want - have)
            s = self.generate(self.encode(problems), n, float(cfg.rollout.temperature), float(cfg.rollout.top_p),
                              self.gen_rollout)
            rep = [p for p in problems for _ in range(n)]
            scores, correct, _ = self.grader(s, rep)
            generated += len(rep)
            if rounds == 0:
                info["rollout/accuracy_all"] = float(correct.float().mean())
            keep = torch.ones(len(rep), dtype=torch.bool)
            if cfg.algo.dynamic_sampling:
                keep = dynamic_sampling_keep(scores, n)
            idx = keep.nonzero().squeeze(-1)
            kept_rows.append(Rows(s.prompt_ids, s.prompt_mask, s.response_ids, s.response_mask).take(idx))
            kept.append(([rep[i] for i in idx.tolist()], scores[idx], correct[idx], s.lengths[idx],
                         s.truncated[idx], s.logprobs[idx]))
            have += len(idx) // n
            rounds += 1
            if have >= want or rounds > int(cfg.rollout.max_resample_rounds) or not cfg.algo.dynamic_sampling:
                break
        rows = _cat_rows(kept_rows, self.pad_id)
        t = rows.response_ids.shape[1]
        batch = Batch(rows=rows, problems=[p for k in kept for p in k[0]],
                      scores=torch.cat([k[1] for k in kept]), correct=torch.cat([k[2] for k in kept]),
                      lengths=torch.cat([k[3] for k in kept]), truncated=torch.cat([k[4] for k in kept]),
                      old_logprobs=torch.cat([torch.nn.functional.pad(k[5], (0, t - k[5].shape[1])) for k in kept]))
        if len(batch.problems) > want * n:  # keep whole groups, at most the step's size
            batch = _slice_batch(batch, want * n)
        info["rollout/generated"] = float(generated)
        info["rollout/resample_rounds"] = float(rounds)
        return batch, info

    @torch.no_grad()
    def _logprobs(self, model: Any, rows: Rows, micro: int) -> torch.Tensor:
        """Returns the response log-probs of ``model`` for all rows, (B, T)."""
        t = rows.response_ids.shape[1]
        parts = [policy_forward(model, rows.take(i), float(self.cfg.rollout.temperature))[0]
                 for i in torch.arange(len(rows.response_ids)).split(micro)]
        return torch.cat([torch.nn.functional.pad(p, (0, t - p.shape[1])) for p in parts])

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch, info = self.collect()
        t_rollout = time.perf_counter() - t0
        faults.point("rollout", self.step + 1)
        if len(batch.problems) == 0:
            return {**info, "rollout/empty_batch": 1.0}
        micro = int(cfg.trainer.micro_batch_size)
        if self.engine is not None:  # vLLM's log-probs differ numerically: recompute with ours
            batch.old_logprobs = self._logprobs(self.policy, batch.rows, micro)
        if self.critic is not None:
            batch.values = batched_values(self.critic, batch.rows, micro)
        if self.ref is not None:
            batch.ref_logprobs = self._logprobs(self.ref, batch.rows, micro)
        compute_advantages(cfg, batch)
        mask = batch.rows.response_mask
        m: dict[str, float] = dict(info)
        t1 = time.perf_counter()
        if self.critic is not None:
            m["critic/explained_variance"] = float(explained_variance(batch.values, batch.returns, mask))
            m["critic/value_mean"] = float(masked_mean(batch.values, mask))
            m.update(self.updater.critic_update(batch, self.step))
            self.critic_sched.step()
            m["critic/lr"] = self.critic_sched.get_last_lr()[0]
        t2 = time.perf_counter()
        faults.point("update", self.step + 1)
        m.update(self.updater.actor_update(batch, self.step))
        self.actor_sched.step()
        if self.engine is not None:
            self.engine.push_weights(self.policy)
        t3 = time.perf_counter()
        lengths = batch.lengths.float()
        n_tokens = float(mask.sum())
        m.update({
            "rollout/reward": float(batch.scores.mean()), "rollout/accuracy": float(batch.correct.float().mean()),
            "rollout/response_length": float(lengths.mean()), "rollout/response_length_max": float(lengths.max()),
            "rollout/truncated_frac": float(batch.truncated.float().mean()),
            "rollout/responses": float(len(batch.problems)),
            "adv/mean": float(masked_mean(batch.advantages, mask)),
            "adv/std": float(batch.advantages[mask.bool()].std()) if n_tokens > 1 else 0.0,
            "actor/lr": self.actor_sched.get_last_lr()[0],
            "time/rollout_s": t_rollout, "time/critic_s": t2 - t1, "time/actor_s": t3 - t2,
            "time/step_s": t3 - t0, "perf/tokens_per_s": n_tokens / max(t_rollout, 1e-9),
            "perf/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        })
        m.update({f"diag/length/{k}": v for k, v in length_profile(batch.lengths, batch.correct).items()})
        if batch.mc_returns is not None:
            bias = value_bias_by_position(batch.values, batch.mc_returns, mask)
            m.update({f"diag/value_bias/{k}": v for k, v in bias.items()})
        if batch.lam_policy is not None:
            m["gae/lam_policy_mean"] = float(batch.lam_policy.mean())
            m["gae/lam_policy_zero_frac"] = float((batch.lam_policy == 0).float().mean())
            if m["gae/lam_policy_zero_frac"] > 0.5 and not self._warned_lambda:
                self._warned_lambda = True
                self.log(f"warning: {100 * m['gae/lam_policy_zero_frac']:.0f}% of responses get lambda_policy = 0 "
                         f"(one-step TD) at gae.alpha={cfg.gae.alpha}: responses shorter than 1/alpha = "
                         f"{1 / cfg.gae.alpha:.0f} tokens. Raise gae.alpha to scale it to these lengths.")
        return m

    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
        cfg = self.cfg
        total = int(cfg.trainer.total_steps)
        history: list[dict[str, Any]] = []
        base_eval = None
        checkpoint = None  # the one this call wrote last (no need to re-verify it at the end)
        k = int(cfg.rollout.eval_samples)
        key = f"eval/avg_at_{k}"
        try:
            if self.step == 0:
                e = evaluate(self.generate, self.tokenizer, self.task, self.grader, cfg, int(cfg.seed) * 7919)
                base_eval = e[key]
                self.log_metrics(e, 0)
            while self.step < total:
                metrics = self.train_step()
                self.step += 1
                if self.step % int(cfg.trainer.eval_every) == 0 or self.step == total:
                    e = evaluate(self.generate, self.tokenizer, self.task, self.grader, cfg,
                                 int(cfg.seed) * 7919 + self.step)
                    metrics.update(e)
                    self.best_eval = e[key] if self.best_eval is None else max(self.best_eval, e[key])
                self.log_metrics(metrics, self.step)
                history.append({"step": self.step, **metrics})
                if self.step % int(cfg.trainer.save_every) == 0 or self.step == total:
                    checkpoint = self.save()
                if on_step:
                    on_step(self.step, metrics)
        except BaseException as e:
            self._close("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED", e)
            raise
        self._close("FINISHED")
        final = history[-1].get(key) if history else None
        return TrainResult(self.run_dir, self.run_id, self.step, final, self.best_eval, base_eval,
                           checkpoint or latest_checkpoint(self.run_dir / "checkpoints"), history)


def _cat_rows(parts: list[Rows], pad_id: int) -> Rows:
    if len(parts) == 1:
        return parts[0]
    p = max(r.prompt_ids.shape[1] for r in parts)
    t = max(r.response_ids.shape[1] for r in parts)
    F = torch.nn.functional
    return Rows(
        torch.cat([F.pad(r.prompt_ids, (p - r.prompt_ids.shape[1], 0), value=pad_id) for r in parts]),
        torch.cat([F.pad(r.prompt_mask, (p - r.prompt_mask.shape[1], 0)) for r in parts]),
        torch.cat([F.pad(r.response_ids, (0, t - r.response_ids.shape[1]), value=pad_id) for r in parts]),
        torch.cat([F.pad(r.response_mask, (0, t - r.response_mask.shape[1])) for r in parts]),
    )


def _slice_batch(batch: Batch, n: int) -> Batch:
    idx = torch.arange(n)
    return Batch(rows=batch.rows.take(idx), problems=batch.problems[:n], scores=batch.scores[:n],
                 correct=batch.correct[:n], lengths=batch.lengths[:n], truncated=batch.truncated[:n],
                 old_logprobs=batch.old_logprobs[:n, :int(batch.rows.take(idx).response_ids.shape[1])])


def train(cfg: DictConfig, choices: dict[str, str] | None = None, progress: bool = True,
          log: Callable[[str], None] = print, on_step: Callable[[int, dict[str, float]], None] | None = None,
          command: str = "") -> TrainResult:
    """Returns the result of training with ``cfg`` (a composed, validated config)."""
    return Run(cfg, choices, progress=progress, log=log, command=command).run(on_step)
