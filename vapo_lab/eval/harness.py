r"""The evaluation harness: N samples per problem from a model, graded, scored, saved, logged.

``evaluate_model`` resolves ``--model`` (a local Hugging Face folder, a vapo-lab run directory or
its MLflow run id: the run's latest checkpoint or ``step``; default the latest run under
``runs/``), samples ``samples`` responses per problem with the paper's protocol by default
(temperature 1.0, top_p 0.7, ``MATH_TEMPLATE`` asking for a ``\boxed{}`` answer, the tokenizer's
chat template when it has one), grades them with the shared grader (``grade_many``: worker
processes, a time limit per sample) and returns avg@N ± SE, a 95% bootstrap CI over problems,
pass@k, maj@N, mean response length and the truncated fraction. ``grade_responses`` grades a
JSONL of responses generated elsewhere, with no model.

Benchmark ``arith`` is the embedded task's held-out split of the evaluated run, with the prompts
the trainer gives and graded as the trainer's periodic eval grades it: the task's own verifier,
a truncated response counting wrong.

Files, in the output folder:

* ``samples.jsonl``: one line per sample, problems in benchmark order, samples in order;
* ``settings.json``: what the samples depend on, written first (a resume must match it);
* ``summary.json``: settings, engine versions, metrics, per-problem results, timings.

Resuming. Problems are generated in fixed chunks of ``chunk_problems`` problems; chunk c draws
from its own ``torch.Generator`` seeded with ``seed + 1_000_003·c`` and is appended to
``samples.jsonl`` whole, after grading. A rerun with the same settings keeps the complete chunks
it finds (a torn last chunk is cut off) and generates only the rest, so an interrupted evaluation
ends with the same file and metrics as an uninterrupted one (on CPU, where the sampler is
deterministic). Chunk 0 is seeded with ``seed`` itself: with one chunk (``chunk_problems=0``) the
draws are exactly those of the trainer's ``evaluate(..., seed)``.

Library code: nothing here prints; the CLI renders progress through ``on_progress`` and ``log``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vapo_lab.errors import VapoLabError
from vapo_lab.eval.data import BENCHMARKS, Benchmark, check_benchmark_name, load_benchmark
from vapo_lab.grading import grade_many, last_boxed, normalize_answer
from vapo_lab.eval.metrics import (
    avg_at_k,
    avg_at_k_se,
    bootstrap_ci,
    maj_at_k,
    majority_index,
    pass_at_k_table,
)
from vapo_lab.tasks import Problem, jsonl_objects

# The final-answer instruction of Qwen2.5-Math's evaluation (the prompt family of the paper's
# base model); ``{problem}`` is replaced verbatim (str.replace, so braces elsewhere stay).
MATH_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}."
# Paper protocol (VAPO §4, AIME avg@32): temperature 1.0, top_p 0.7.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 0.7
# Max new tokens for the math benchmarks when not given (the paper's 20k does not fit a CPU).
DEFAULT_MAX_TOKENS = 1024
# Rows decoded per chunk when chunk_problems is not given: the built-in sampler's own batch.
ROWS_PER_CHUNK = 256
# Chunk c's generator seed: seed + CHUNK_SEED_STRIDE·c (a prime, so chunks of nearby seeds differ).
CHUNK_SEED_STRIDE = 1_000_003
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
SAMPLES_FILE = "samples.jsonl"
SETTINGS_FILE = "settings.json"
SUMMARY_FILE = "summary.json"
EVAL_EXPERIMENT = "eval"
ARITH = "arith"

_RUN_ID = re.compile(r"[0-9a-f]{32}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


class EvalError(VapoLabError):
    """An evaluation cannot start or resume: a bad model, benchmark, file or setting."""


# -- settings ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalSettings:
    """How samples are drawn and graded; the defaults are the paper's AIME protocol.

    Attributes:
        samples: N, responses per problem.
        temperature: sampling temperature (0: greedy).
        top_p: nucleus mass.
        max_tokens: new tokens per response; None: the run's ``rollout.max_new_tokens`` for
            arith, else ``DEFAULT_MAX_TOKENS``.
        seed: None: for arith on a run checkpoint, the trainer's periodic-eval seed at that step
            (``seed·7919 + step``), else 0.
        backend: builtin | vllm.
        template: the prompt around a math problem (must hold ``{problem}``); arith prompts are
            the trainer's and take no template.
        chat_template: auto (apply the tokenizer's when it has one) | none; arith: the run's
            ``model.chat_template``.
        chunk_problems: problems per generation chunk (the unit of resuming and seeding); None:
            ``ROWS_PER_CHUNK // samples``; 0: all problems in one chunk.
        device: auto | cpu | cuda[:i].
        dtype: float32 | bfloat16 | float16; None: the run's ``model.dtype``, else float32 on
            CPU and bfloat16 on a GPU.
        grade_timeout_s: grader time limit per sample (``grade_many``).
        grade_workers: grader processes; None: min(4, CPU count).
        threads: torch CPU threads; None leaves torch's default.
    """

    samples: int = 32
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    max_tokens: int | None = None
    seed: int | None = None
    backend: str = "builtin"
    template: str = MATH_TEMPLATE
    chat_template: str = "auto"
    chunk_problems: int | None = None
    device: str = "auto"
    dtype: str | None = None
    grade_timeout_s: float = 5.0
    grade_workers: int | None = None
    threads: int | None = None


def check_settings(s: EvalSettings) -> None:
    """Raises EvalError naming every bad setting at once."""
    problems = []
    if s.samples < 1:
        problems.append(f"--samples {s.samples}: need at least 1 sample per problem")
    if s.temperature < 0:
        problems.append(f"--temperature {s.temperature}: must be >= 0 (0 is greedy)")
    if not 0 < s.top_p <= 1:
        problems.append(f"--top-p {s.top_p}: must be in (0, 1]")
    if s.max_tokens is not None and s.max_tokens < 1:
        problems.append(f"--max-tokens {s.max_tokens}: must be >= 1")
    if s.backend not in ("builtin", "vllm"):
        problems.append(f"--backend {s.backend}: use builtin or vllm")
    if "{problem}" not in s.template:
        problems.append("--template must contain {problem}, where the problem text goes")
    if s.chat_template not in ("auto", "none"):
        problems.append(f"chat_template={s.chat_template!r}: use auto or none")
    if s.chunk_problems is not None and s.chunk_problems < 0:
        problems.append(f"--chunk-problems {s.chunk_problems}: must be >= 0 (0: one chunk)")
    if s.grade_timeout_s <= 0:
        problems.append(f"grade_timeout_s={s.grade_timeout_s}: must be > 0")
    if problems:
        raise EvalError("\n".join(problems))


# -- model resolution ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelRef:
    """What ``--model`` names, resolved to files.

    Attributes:
        path: the policy's ``save_pretrained`` folder.
        tokenizer_path: the tokenizer's folder; None for a tiny run (its tokenizer is rebuilt
            from the task's vocabulary, exactly as the base model's was).
        run_dir: the vapo-lab run, when the model is one of its checkpoints.
        run_id: its tracking run id (run.json).
        tracking_uri: its tracking store (run.json; "none" when trained with tracking=none).
        step: the checkpoint's training step.
        checkpoint: the checkpoint folder (``<run>/checkpoints/step_NNNNNN``).
        cfg: the run's saved config (config.yaml).
        base_config: for a bare embedded base folder, its build config (base.json).
    """

    path: Path
    tokenizer_path: Path | None = None
    run_dir: Path | None = None
    run_id: str | None = None
    tracking_uri: str | None = None
    step: int | None = None
    checkpoint: Path | None = None
    cfg: Any = None
    base_config: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        """Returns the JSON-able record of the model for the summary."""
        name = self.cfg.model.name if self.cfg is not None else ("tiny" if self.base_config is not None else "hf")
        return {"name": str(name), "path": str(self.path.resolve()), "run_dir": str(self.run_dir.resolve()) if self.run_dir else None,
                "run_id": self.run_id, "checkpoint": str(self.checkpoint.resolve()) if self.checkpoint else None,
                "step": self.step}


def latest_run(runs_dir: Path) -> Path:
    """Returns the most recently started run under ``runs_dir`` (newest run.json)."""
    runs = sorted((p.parent for p in runs_dir.glob("*/run.json")), key=lambda d: (d / "run.json").stat().st_mtime)
    if not runs:
        raise EvalError(f"no vapo-lab run under {runs_dir}/ to evaluate: train one (`vapo-lab train`), "
                        "or give --model a run directory, an MLflow run id or a local model folder")
    return runs[-1]


def find_run(run_id: str, runs_dir: Path, tracking_uri: str | None = None) -> Path:
    """Returns the run directory of tracking run ``run_id``: under ``runs_dir``, else its MLflow tag."""
    for run_json in runs_dir.glob("*/run.json"):
        try:
            if json.loads(run_json.read_text()).get("run_id") == run_id:
                return run_json.parent
        except (OSError, json.JSONDecodeError):
            continue
    found = None
    try:
        from mlflow.tracking import MlflowClient

        from vapo_lab.track import resolve_tracking_uri

        run = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri)).get_run(run_id)
        found = run.data.tags.get("run_dir")
    except Exception:  # noqa: BLE001 - unknown id or unreachable store: the error below says both
        found = None
    if found and (Path(found) / "run.json").is_file():
        return Path(found)
    raise EvalError(f"--model {run_id}: no run with this MLflow run id under {runs_dir}/ nor in the tracking "
                    "store (or its run_dir tag points nowhere): give the run directory instead, e.g. runs/vapo-seed0-...")


def _checkpoints(run_dir: Path) -> dict[int, Path]:
    """Returns {step: folder} of the run's complete checkpoints."""
    from vapo_lab.runs.checkpoint import STATE_FILE

    out = {}
    for p in (run_dir / "checkpoints").glob("step_*"):
        if (p / STATE_FILE).is_file() and p.name[5:].isdigit():
            out[int(p.name[5:])] = p
    return out


def _run_checkpoint(run_dir: Path, step: int | None) -> ModelRef:
    """Returns the ModelRef of a run's checkpoint at ``step`` (None: the latest)."""
    from omegaconf import OmegaConf

    from vapo_lab.runs.checkpoint import latest_checkpoint

    if not (run_dir / "config.yaml").is_file():
        raise EvalError(f"{run_dir} has run.json but no config.yaml: not a complete vapo-lab run directory")
    info = json.loads((run_dir / "run.json").read_text())
    cfg = OmegaConf.load(run_dir / "config.yaml")
    found = _checkpoints(run_dir)
    if step is None:
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise EvalError(f"run {run_dir} has no checkpoint yet (saved every trainer.save_every steps): wait for "
                            "one, or evaluate a model folder with --model PATH")
        step = int(ckpt.name[5:])
    elif step not in found:
        have = ", ".join(str(s) for s in sorted(found)) or "none"
        raise EvalError(f"--step {step}: run {run_dir} has no checkpoint at step {step} (it has: {have}; "
                        "trainer.keep keeps only the latest ones): choose one of those steps")
    else:
        ckpt = found[step]
    policy = ckpt / "policy"
    if not (policy / "config.json").is_file():
        raise EvalError(f"checkpoint {ckpt} has no policy/config.json: it was not written by this vapo-lab "
                        "(policies are saved with save_pretrained)")
    tok = None
    if cfg.model.name != "tiny":
        tok = Path(cfg.model.tokenizer_path or cfg.model.path)
    return ModelRef(path=policy, tokenizer_path=tok, run_dir=run_dir, run_id=info.get("run_id"),
                    tracking_uri=info.get("tracking_uri"), step=step, checkpoint=ckpt, cfg=cfg)


def resolve_model(model: str | Path | None, step: int | None = None, runs_dir: str | Path = "runs",
                  tracking_uri: str | None = None) -> ModelRef:
    """Returns what ``--model`` names: a run's checkpoint, or a local model folder.

    Args:
        model: a run directory (run.json), a checkpoint folder inside one, a ``save_pretrained``
            folder (config.json), an MLflow run id of a vapo-lab run, or None for the latest run
            under ``runs_dir``.
        step: the run's checkpoint at this training step; None: its latest.
        runs_dir: where runs are looked for (the trainer's ``output_dir``).
        tracking_uri: the MLflow store to look a run id up in (default: ``resolve_tracking_uri``).

    Raises:
        EvalError: nothing there, no checkpoint, or ``step`` missing (the steps found are listed).
    """
    runs_dir = Path(runs_dir)
    if model is None:
        return _run_checkpoint(latest_run(runs_dir), step)
    path = Path(model)
    if path.is_dir():
        if (path / "run.json").is_file():
            return _run_checkpoint(path, step)
        if (path / "policy" / "config.json").is_file() and (path.parent.parent / "run.json").is_file():
            ckpt_step = int(path.name[5:]) if path.name[5:].isdigit() else None
            if step is not None and step != ckpt_step:
                raise EvalError(f"--model {path} is the checkpoint of step {ckpt_step}, but --step {step} was "
                                "given: drop --step, or give the run directory")
            return _run_checkpoint(path.parent.parent, ckpt_step)
        if (path / "config.json").is_file():
            if step is not None:
                raise EvalError(f"--step {step} picks a checkpoint of a vapo-lab run, but --model {path} is a "
                                "model folder: drop --step")
            base_json = path / "base.json"
            base = json.loads(base_json.read_text())["config"] if base_json.is_file() else None
            return ModelRef(path=path, tokenizer_path=path, base_config=base)
        raise EvalError(f"--model {path} is a folder with neither run.json (a vapo-lab run) nor config.json "
                        "(a save_pretrained model)")
    if _RUN_ID.fullmatch(str(model)):
        return _run_checkpoint(find_run(str(model), runs_dir, tracking_uri), step)
    raise EvalError(f"--model {model} does not exist: give a run directory (e.g. runs/vapo-seed0-...), its "
                    "MLflow run id, or a local model folder with config.json")


# -- benchmarks ----------------------------------------------------------------------------------
@dataclass
class EvalBench:
    """A benchmark ready to evaluate: problems, how their prompts are written, how they are graded.

    ``verify`` is set for arith (the task's verifier, truncated counting wrong, as the trainer's
    eval); otherwise responses go through ``grade_many``.
    """

    name: str
    problems: list[Problem]
    integer_answers: bool
    source: str
    verify: Callable[[str, Problem], bool] | None = None
    chat_template: str | None = None  # arith: the run's model.chat_template
    run_seed: int | None = None  # arith on a run: the run's seed (periodic-eval seeds derive from it)
    default_max_tokens: int | None = None  # arith on a run: its rollout.max_new_tokens


def arith_bench(ref: ModelRef | None) -> EvalBench:
    """Returns the embedded task's eval split of the run (or bare base folder) ``ref``."""
    from vapo_lab.tasks import build_task

    if ref is None or (ref.cfg is None and ref.base_config is None):
        raise EvalError("benchmark arith is the held-out split of a run's embedded task: give --model a vapo-lab "
                        "run (or the embedded base model's folder), not a model without one")
    if ref.cfg is not None:
        c = ref.cfg.task
        if c.name != ARITH:
            raise EvalError(f"run {ref.run_dir} trained on task={c.name}, not arith: evaluate its eval file "
                            f"with --data {c.eval_path or c.train_path}")
        task = build_task(ARITH, seed=int(c.seed), n_train=int(c.n_train), n_eval=int(c.n_eval), **dict(c.options))
        return EvalBench(ARITH, list(task.eval), True, f"task=arith seed={c.seed} n_eval={c.n_eval} "
                         f"options={dict(c.options)}", verify=task.verify, chat_template=str(ref.cfg.model.chat_template),
                         run_seed=int(ref.cfg.seed), default_max_tokens=int(ref.cfg.rollout.max_new_tokens))
    b = ref.base_config
    task = build_task(ARITH, seed=int(b["task_seed"]), n_train=int(b["n_train"]), n_eval=int(b["n_eval"]),
                      min_digits=int(b["min_digits"]), max_digits=int(b["max_digits"]),
                      length_exponent=float(b["length_exponent"]))
    return EvalBench(ARITH, list(task.eval), True, f"task=arith from {ref.path}/base.json", verify=task.verify,
                     chat_template="none")


def check_benchmark(bench: str | None, data: str | Path | None = None) -> None:
    """Raises EvalError or ConfigError unless ``bench`` / ``data`` name one benchmark that exists; reads
    nothing, so a command checks it before it resolves or loads a model."""
    if data is not None:
        if bench not in (None, str(data)):
            raise EvalError(f"give either a benchmark name ({bench}) or --data {data}, not both")
        check_benchmark_name(data)
    elif bench is None:
        raise EvalError(f"no benchmark given: name one of arith, {', '.join(BENCHMARKS)}, or give --data FILE.jsonl")
    elif bench != ARITH:
        check_benchmark_name(bench)


def load_eval_bench(bench: str | None, ref: ModelRef | None, data: str | Path | None = None,
                    problem_key: str | None = None, answer_key: str | None = None) -> EvalBench:
    """Returns the benchmark to evaluate: arith, a packaged set, or ``data`` (a JSONL file)."""
    check_benchmark(bench, data)
    if data is not None:
        b: Benchmark = load_benchmark(Path(data), problem_key, answer_key)
        return EvalBench(b.name, b.problems, b.integer_answers, str(Path(data).resolve()))
    assert bench is not None  # check_benchmark
    if bench == ARITH:
        return arith_bench(ref)
    b = load_benchmark(bench, problem_key, answer_key)
    source = f"vapo_lab/data/{BENCHMARKS[bench].file}" if bench in BENCHMARKS else str(Path(bench).resolve())
    return EvalBench(b.name, b.problems, b.integer_answers, source)


def _fingerprint(problems: Sequence[Problem]) -> str:
    """Returns a 16-hex-digit hash of the problems' ids, prompts and answers."""
    blob = json.dumps([[p.id, p.prompt, p.answer] for p in problems], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# -- results -------------------------------------------------------------------------------------
@dataclass
class EvalResult:
    """What an evaluation returns; ``summary`` is also written to ``out_dir/summary.json``."""

    out_dir: Path
    summary: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> dict[str, Any]:
        return self.summary["metrics"]

    @property
    def per_problem(self) -> list[dict[str, Any]]:
        return self.summary["per_problem"]

    @property
    def samples_path(self) -> Path:
        return self.out_dir / SAMPLES_FILE


def compute_metrics(records: Sequence[dict[str, Any]], problems: Sequence[Problem],
                    integer: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Returns (metrics, per-problem rows) of graded sample records, problems in benchmark order.

    Problems without a record are left out (``problems_graded`` counts the rest). avg@N is the
    mean per-sample accuracy (pass@1 from N samples), its SE and bootstrap CI over problems;
    pass@k for k = 1, 2, 4, ... N (the unbiased estimator); maj@N votes by normalised answer.
    ``grade_timeouts`` / ``grade_errors`` count the samples the grader timed out on / crashed on.
    """
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_problem.setdefault(r["problem_id"], []).append(r)
    graded = [p for p in problems if p.id in by_problem]
    if not graded:
        raise EvalError("no graded sample to compute metrics from")
    correct = [[bool(r["correct"]) for r in by_problem[p.id]] for p in graded]
    answers = [[r["extracted_answer"] for r in by_problem[p.id]] for p in graded]
    counts = [len(row) for row in correct]
    n = min(counts)
    se = avg_at_k_se(correct)
    lo, hi = bootstrap_ci(correct, level=0.95, resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
    lengths = [r["length"] for r in records if r.get("length") is not None]
    reasons = [r.get("finish_reason") for r in records]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.get("grade_status", "ok")] = statuses.get(r.get("grade_status", "ok"), 0) + 1
    metrics = {
        "samples_per_problem": n if n == max(counts) else {"min": n, "max": max(counts)},
        "problems_graded": len(graded), "problems_total": len(problems), "samples_graded": len(records),
        f"avg_at_{n}": avg_at_k(correct), f"avg_at_{n}_se": None if math.isnan(se) else se,
        f"avg_at_{n}_ci95": [lo, hi],
        "pass_at_k": {str(k): v for k, v in pass_at_k_table(correct).items()},
        f"maj_at_{n}": maj_at_k(answers, correct, k=n, integer=integer),
        "response_length": sum(lengths) / len(lengths) if lengths else None,
        "truncated_frac": (sum(r == "length" for r in reasons) / len(reasons)
                           if all(r is not None for r in reasons) else None),
        "grade_status": statuses,
        # samples over the grader's time limit or whose grading crashed: counted wrong above, and
        # counted here apart, so that they show in the summary and log as metrics
        "grade_timeouts": statuses.get("timeout", 0),
        "grade_errors": statuses.get("error", 0),
    }
    rows = []
    for p, row, ans in zip(graded, correct, answers):
        keys = [None if a is None else normalize_answer(a, integer) for a in ans]
        top = majority_index(keys)
        rows.append({"problem_id": p.id, "reference": p.answer, "samples": len(row), "correct": sum(row),
                     "accuracy": sum(row) / len(row), "majority_answer": None if top is None else ans[top],
                     "majority_correct": top is not None and row[top]})
    return metrics, rows


def metric_names(bench: str, metrics: dict[str, Any]) -> dict[str, float]:
    """Returns the MLflow metrics ``eval/<bench>/<name>`` (MLflow names cannot hold ``@``)."""
    safe = _UNSAFE.sub("_", bench)
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "pass_at_k":
            out.update({f"eval/{safe}/pass_at_{k}": float(v) for k, v in value.items()})
        elif key.endswith("_ci95"):
            out[f"eval/{safe}/{key[:-5]}_ci95_low"], out[f"eval/{safe}/{key[:-5]}_ci95_high"] = map(float, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in (
                "samples_per_problem", "problems_graded", "problems_total", "samples_graded"):
            out[f"eval/{safe}/{key}"] = float(value)
    return out


# -- the samples file ----------------------------------------------------------------------------
def _read_records(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """Returns (records, byte offset after each) of the complete JSON lines of ``path``."""
    records, ends = [], []
    offset = 0
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # a torn last line
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
            offset += len(line)
            ends.append(offset)
    return records, ends


def _check_resume(out_dir: Path, settings: dict[str, Any]) -> None:
    """Raises EvalError when ``out_dir`` holds samples written with other settings."""
    saved_path = out_dir / SETTINGS_FILE
    if not saved_path.is_file():
        raise EvalError(f"{out_dir / SAMPLES_FILE} exists without its {SETTINGS_FILE}: its settings are unknown, "
                        "so it cannot be resumed; pass --overwrite, or another --out")
    saved = json.loads(saved_path.read_text())
    diff = [k for k in sorted(set(saved) | set(settings)) if saved.get(k) != settings.get(k)]
    if diff:
        shown = ", ".join(f"{k}={_short(saved.get(k))} (now {_short(settings.get(k))})" for k in diff)
        raise EvalError(f"{out_dir / SAMPLES_FILE} was written with other settings: {shown}; rerun with the same "
                        "settings to resume it, or pass --overwrite, or another --out")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _chunks(n_problems: int, per_chunk: int) -> list[range]:
    """Returns the problem index ranges of the generation chunks."""
    return [range(i, min(i + per_chunk, n_problems)) for i in range(0, n_problems, per_chunk)]


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    """Appends ``records`` as JSON lines in one write, flushed to disk (a chunk lands whole or torn)."""
    blob = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    with path.open("a", encoding="utf-8") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, data: Any) -> None:
    """Writes JSON atomically (temporary file, then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# -- grading -------------------------------------------------------------------------------------
def grade_records(records: list[dict[str, Any]], bench: EvalBench, problems: dict[str, Problem],
                  settings: EvalSettings) -> None:
    """Fills ``extracted_answer``, ``correct`` and ``grade_status`` of each record in place.

    arith: the task's verifier (the last box equals the sum), a truncated response wrong, as in
    the trainer's reward and eval. Otherwise ``grade_many`` (worker processes, a time limit per
    sample; a timeout or crash counts wrong and is reported in ``grade_status``).
    """
    if bench.verify is not None:
        for r in records:
            box = last_boxed(r["response"])
            r["extracted_answer"] = box.strip() if box is not None and box.strip() else None
            r["correct"] = bool(bench.verify(r["response"], problems[r["problem_id"]])) and r["finish_reason"] != "length"
            r["grade_status"] = "ok" if r["extracted_answer"] is not None else "no_answer"
        return
    results = grade_many([r["response"] for r in records], [problems[r["problem_id"]].answer for r in records],
                         bench.integer_answers, timeout_s=settings.grade_timeout_s, workers=settings.grade_workers)
    for r, g in zip(records, results):
        r["extracted_answer"], r["correct"], r["grade_status"] = g.answer, bool(g.correct), g.status
        if g.status in ("timeout", "error"):
            r["grade_detail"] = g.detail


def _grader_settings(bench: EvalBench, settings: EvalSettings) -> dict[str, Any]:
    if bench.verify is not None:
        return {"grader": "task verifier (arith): last \\boxed{} equals the sum; truncated counts wrong"}
    return {"grader": "vapo_lab.grading.grade_many", "integer_answers": bench.integer_answers,
            "timeout_s": settings.grade_timeout_s}


# -- generation ----------------------------------------------------------------------------------
@dataclass
class _Loaded:
    policy: Any
    tokenizer: Any
    generate: Any
    engine: str
    engine_version: str
    device: str
    dtype: str
    eos_ids: list[int]
    pad_id: int


def _device(name: str) -> str:
    from vapo_lab.models.load import pick_device

    return str(pick_device(name, "--device"))


def load_tokenizer(ref: ModelRef) -> Any:
    """Returns the tokenizer of ``ref`` (a tiny run's is rebuilt from its task's vocabulary)."""
    if ref.tokenizer_path is not None:
        from transformers import AutoTokenizer

        trust = bool(ref.cfg.model.trust_remote_code) if ref.cfg is not None else False
        tok = AutoTokenizer.from_pretrained(ref.tokenizer_path, local_files_only=True, trust_remote_code=trust)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks import build_task

    c = ref.cfg.task
    task = build_task(ARITH, seed=int(c.seed), n_train=0, n_eval=0, **dict(c.options))
    return build_tokenizer(task.vocabulary())


def load_generator(ref: ModelRef, settings: EvalSettings, max_tokens: int, seed: int) -> _Loaded:
    """Returns the policy, its tokenizer and the sampling function of ``settings.backend``."""
    import torch
    import transformers

    from vapo_lab import __version__
    from vapo_lab.models.load import DTYPES
    from vapo_lab.rollout import make_generator

    device = _device(settings.device)
    dtype = settings.dtype or (str(ref.cfg.model.dtype) if ref.cfg is not None else
                               ("float32" if device == "cpu" else "bfloat16"))
    if dtype not in DTYPES:
        raise EvalError(f"dtype={dtype!r}: use one of {', '.join(DTYPES)}")
    engine = None
    if settings.backend == "vllm":  # fail before loading anything when vLLM or a GPU is missing
        from vapo_lab.rollout.vllm_backend import (
            BackendUnavailable,
            VllmEngine,
            require_vllm,
        )

        try:
            require_vllm()
        except BackendUnavailable as e:
            # no "[gpu]" in the message: the CLI prints errors as rich markup, which eats it
            if "not installed" in str(e):
                raise EvalError("--backend vllm needs vLLM, which is not installed: install the gpu extra of "
                                "vapo-lab (`pip install vllm`) on a machine with a CUDA GPU, or use --backend "
                                "builtin") from None
            raise EvalError(str(e).replace("rollout.backend=", "--backend ")) from None
    tokenizer = load_tokenizer(ref)
    policy = None
    if settings.backend == "builtin":
        from transformers import AutoModelForCausalLM

        trust = bool(ref.cfg.model.trust_remote_code) if ref.cfg is not None else False
        policy = AutoModelForCausalLM.from_pretrained(ref.path, dtype=DTYPES[dtype], local_files_only=True,
                                                      trust_remote_code=trust).to(device).eval()
        name, version = "builtin", f"vapo-lab {__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    else:
        engine = VllmEngine(ref.path, dtype=dtype, seed=seed, max_model_len=None)
        name, version = "vllm", str(engine.version)
    eos_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
    generate = make_generator(settings.backend, policy, max_tokens, eos_ids, pad_id, engine)
    return _Loaded(policy, tokenizer, generate, name, version, device, dtype, eos_ids, pad_id)


def _prompt_ids(bench: EvalBench, tokenizer: Any, settings: EvalSettings) -> tuple[list[list[int]], bool]:
    """Returns (prompt token ids per problem, whether a chat template was applied)."""
    from vapo_lab.rollout.prompts import encode_prompts

    if bench.verify is not None:  # arith: the trainer's own prompts
        mode, problems = bench.chat_template or "none", bench.problems
    else:
        mode = settings.chat_template
        problems = [replace(p, prompt=settings.template.replace("{problem}", p.prompt)) for p in bench.problems]
    applied = mode == "auto" and bool(getattr(tokenizer, "chat_template", None))
    return encode_prompts(tokenizer, problems, mode), applied


def _context_of(policy: Any) -> int | None:
    return getattr(getattr(policy, "config", None), "max_position_embeddings", None) if policy is not None else None


# -- the evaluation ------------------------------------------------------------------------------
def default_out_dir(bench: str, ref: ModelRef | None, samples: int, seed: int) -> Path:
    """Returns where results go by default: the run's ``eval/`` folder, else ``evals/``."""
    name = f"{_UNSAFE.sub('_', bench).replace('/', '_')}-n{samples}-seed{seed}"
    if ref is not None and ref.run_dir is not None:
        return ref.run_dir / "eval" / f"step{ref.step}-{name}"
    model = ref.path.resolve().name if ref is not None else "responses"
    return Path("evals") / f"{model}-{name}"


def evaluate_model(
    bench: str | None,
    model: str | Path | None = None,
    step: int | None = None,
    settings: EvalSettings = EvalSettings(),
    out_dir: str | Path | None = None,
    data: str | Path | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
    runs_dir: str | Path = "runs",
    track: bool = True,
    tracking_uri: str | None = None,
    overwrite: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> EvalResult:
    """Returns the graded evaluation of ``model`` on ``bench``: N samples per problem, metrics, files.

    Args:
        bench: arith | aime24 | aime25 | math500 | gsm8k | a JSONL path (None with ``data``).
        model: see ``resolve_model``; None: the latest run under ``runs_dir``.
        step: the run checkpoint's training step (None: the latest checkpoint).
        settings: sampling and grading (the defaults are the paper's AIME protocol).
        out_dir: output folder; None: ``default_out_dir``. Holding samples written with the same
            settings, it is resumed; with other settings it is refused (``overwrite`` restarts).
        data, problem_key, answer_key: a JSONL benchmark and its field names.
        runs_dir: where runs (and the latest one) are looked for.
        track: log the metrics to MLflow: into the training run at the checkpoint's step when
            the model is a run's checkpoint tracked in MLflow, else to a new run in experiment
            ``eval``. False: nothing is logged.
        tracking_uri: the MLflow store for a new run (default: ``resolve_tracking_uri``).
        overwrite: delete earlier samples in ``out_dir`` first.
        on_progress: called with (samples done, samples in all) at the start and after each
            chunk; an exception raised there stops the evaluation with the chunks so far on disk.
        log: receives progress messages (resuming, warnings).

    Raises:
        EvalError, ConfigError: bad model, benchmark, settings or out folder; one line each.
    """
    import torch

    check_settings(settings)
    check_benchmark(bench, data)  # a file or packaged set is read before the model is looked for; arith needs the run
    early = None if bench == ARITH and data is None else load_eval_bench(bench, None, data, problem_key, answer_key)
    ref = resolve_model(model, step, runs_dir, tracking_uri)
    bch = early or load_eval_bench(bench, ref, data, problem_key, answer_key)
    n = settings.samples
    seed = settings.seed
    seed_rule = "given"
    if seed is None:
        if bch.run_seed is not None and ref.step is not None:
            seed, seed_rule = bch.run_seed * 7919 + ref.step, "the trainer's periodic-eval seed at this step (seed*7919+step)"
        else:
            seed, seed_rule = 0, "default"
    max_tokens = settings.max_tokens or bch.default_max_tokens or DEFAULT_MAX_TOKENS
    per_chunk = settings.chunk_problems if settings.chunk_problems is not None else max(1, ROWS_PER_CHUNK // n)
    per_chunk = per_chunk or len(bch.problems)
    chunks = _chunks(len(bch.problems), per_chunk)
    out = Path(out_dir) if out_dir is not None else default_out_dir(bch.name, ref, n, seed)
    warnings: list[str] = []
    if settings.threads:
        torch.set_num_threads(int(settings.threads))

    device = _device(settings.device)
    key = {
        "benchmark": bch.name, "benchmark_source": bch.source, "benchmark_fingerprint": _fingerprint(bch.problems),
        "problems": len(bch.problems), "model": str(ref.path.resolve()), "step": ref.step,
        "backend": settings.backend, "device": device, "dtype": settings.dtype, "samples": n,
        "temperature": settings.temperature, "top_p": settings.top_p, "max_tokens": max_tokens, "seed": seed,
        "chunk_problems": per_chunk, "chunk_seed": f"seed + {CHUNK_SEED_STRIDE} * chunk",
        "template": None if bch.verify is not None else settings.template,
        "chat_template": bch.chat_template if bch.verify is not None else settings.chat_template,
        **_grader_settings(bch, settings),
    }

    _require_out(out, out_dir is not None)
    out.mkdir(parents=True, exist_ok=True)
    samples_path = out / SAMPLES_FILE
    if overwrite:
        for name in (SAMPLES_FILE, SETTINGS_FILE, SUMMARY_FILE):
            (out / name).unlink(missing_ok=True)
    records: list[dict[str, Any]] = []
    if samples_path.exists():
        _check_resume(out, key)
        records, ends = _read_records(samples_path)
        done_rows = 0
        complete = 0
        for c in chunks:  # whole chunks only, in order
            if len(records) < done_rows + len(c) * n:
                break
            done_rows += len(c) * n
            complete += 1
        expected = [(bch.problems[i].id, j) for c in chunks[:complete] for i in c for j in range(n)]
        if [(r.get("problem_id"), r.get("sample_index")) for r in records[:done_rows]] != expected:
            raise EvalError(f"{samples_path} does not hold the samples these settings give, in order: it was edited "
                            "or written by another version; pass --overwrite, or another --out")
        with samples_path.open("r+b") as f:  # drop a torn or partial last chunk
            f.truncate(ends[done_rows - 1] if done_rows else 0)
        records = records[:done_rows]
        if complete:
            log(f"resuming {samples_path}: {complete} of {len(chunks)} chunks ({done_rows} samples) already done")
    else:
        complete = 0
        _write_json(out / SETTINGS_FILE, key)
    problems = {p.id: p for p in bch.problems}
    total = len(bch.problems) * n
    t_start = time.perf_counter()
    t_gen = t_grade = 0.0
    gen_tokens = 0
    loaded = None
    if on_progress:
        on_progress(len(records), total)
    if complete < len(chunks):
        loaded = load_generator(ref, settings, max_tokens, seed)
        prompt_ids, applied = _prompt_ids(bch, loaded.tokenizer, settings)
        context = _context_of(loaded.policy)
        longest = max(len(p) for p in prompt_ids)
        if context is not None and longest + max_tokens > context:
            warnings.append(f"the longest prompt ({longest} tokens) plus --max-tokens {max_tokens} exceeds the "
                            f"model's context of {context} tokens: its outputs there are out of distribution")
            log(f"warning: {warnings[-1]}")
        for c_index in range(complete, len(chunks)):
            idx = list(chunks[c_index])
            gen = torch.Generator().manual_seed(seed + CHUNK_SEED_STRIDE * c_index)
            t0 = time.perf_counter()
            s = loaded.generate([prompt_ids[i] for i in idx], n, settings.temperature, settings.top_p, gen)
            t_gen += time.perf_counter() - t0
            lengths = s.lengths.tolist()
            gen_tokens += sum(lengths)
            chunk_records = []
            for row in range(len(idx) * n):
                i = idx[row // n]
                ids = s.response_ids[row, :lengths[row]].tolist()
                chunk_records.append({
                    "problem_id": bch.problems[i].id, "sample_index": row % n,
                    "prompt": loaded.tokenizer.decode(prompt_ids[i], skip_special_tokens=False),
                    "response": loaded.tokenizer.decode(ids, skip_special_tokens=True),
                    "extracted_answer": None, "reference": bch.problems[i].answer, "correct": False,
                    "length": lengths[row], "finish_reason": "stop" if bool(s.finished[row]) else "length",
                })
            t0 = time.perf_counter()
            grade_records(chunk_records, bch, problems, settings)
            t_grade += time.perf_counter() - t0
            _append(samples_path, chunk_records)
            records.extend(chunk_records)
            if on_progress:
                on_progress(len(records), total)
    else:
        applied = None
        log(f"{samples_path} is complete: metrics recomputed from it, nothing generated")
    # what only a loaded engine knows; when nothing was generated now, the earlier summary's record
    earlier = json.loads((out / SUMMARY_FILE).read_text()).get("generation", {}) if (
        loaded is None and (out / SUMMARY_FILE).is_file()) else {}
    engine = {"engine": loaded.engine, "engine_version": loaded.engine_version, "dtype": loaded.dtype,
              "eos_ids": loaded.eos_ids, "chat_template_applied": applied} if loaded is not None else {
        "engine": earlier.get("engine", settings.backend), "engine_version": earlier.get("engine_version"),
        "dtype": earlier.get("dtype", settings.dtype), "eos_ids": earlier.get("eos_ids"),
        "chat_template_applied": earlier.get("chat_template_applied")}

    metrics, rows = compute_metrics(records, bch.problems, bch.integer_answers)
    wall = time.perf_counter() - t_start
    bad = {k: v for k, v in metrics["grade_status"].items() if k in ("timeout", "error")}
    if bad:
        warnings.append(f"grading: {', '.join(f'{v} {k}' for k, v in bad.items())} (counted wrong; see grade_detail "
                        f"in {samples_path})")
    summary = {
        "benchmark": {"name": bch.name, "source": bch.source, "problems": len(bch.problems),
                      "integer_answers": bch.integer_answers, "fingerprint": key["benchmark_fingerprint"]},
        "model": ref.describe(),
        "generation": {"engine": engine["engine"], "engine_version": engine["engine_version"],
                       "device": device, "dtype": engine["dtype"],
                       "samples": n, "temperature": settings.temperature, "top_p": settings.top_p,
                       "max_tokens": max_tokens, "seed": seed, "seed_rule": seed_rule,
                       "chunk_problems": per_chunk, "chunk_seed": key["chunk_seed"],
                       "template": key["template"], "chat_template": key["chat_template"],
                       "chat_template_applied": engine["chat_template_applied"], "eos_ids": engine["eos_ids"]},
        "grading": {**_grader_settings(bch, settings), "bootstrap": {"level": 0.95, "resamples": BOOTSTRAP_RESAMPLES,
                                                                      "seed": BOOTSTRAP_SEED, "unit": "problem"}},
        "metrics": metrics,
        "per_problem": rows,
        "timing": {"wall_s": wall, "generate_s": t_gen, "grade_s": t_grade, "generated_tokens": gen_tokens,
                   "resumed_chunks": complete},
        "files": {"samples": str(samples_path), "settings": str(out / SETTINGS_FILE)},
        "warnings": warnings,
    }
    summary["tracking"] = log_metrics_to_mlflow(summary, ref, bch.name, tracking_uri, warnings) if track else None
    _write_json(out / SUMMARY_FILE, summary)
    return EvalResult(out, summary, warnings)


def log_metrics_to_mlflow(summary: dict[str, Any], ref: ModelRef | None, bench: str, tracking_uri: str | None,
                          warnings: list[str]) -> dict[str, Any] | None:
    """Logs ``eval/<bench>/...`` metrics: into the training run at the checkpoint's step, else a new run.

    Returns where they went ({"run_id", "uri", "step", "new_run"}), or None with a warning when the
    store cannot be reached (the results stay on disk).
    """
    from vapo_lab.track import MlflowTracker, TrackingError

    metrics = metric_names(bench, summary["metrics"])
    gen = summary["generation"]
    artifact = f"eval/{_UNSAFE.sub('_', bench).replace('/', '_')}-step{ref.step if ref else 0}-n{gen['samples']}-seed{gen['seed']}.json"
    try:
        if ref is not None and ref.run_id and ref.tracking_uri and ref.tracking_uri != "none":
            tracker = MlflowTracker(uri=ref.tracking_uri)
            tracker.run_id = ref.run_id  # log beside the training metrics; its status is left alone
            tracker.log_metrics(metrics, int(ref.step or 0))
            tracker.log_text(json.dumps(summary, indent=2), artifact)
            if tracker.failures:
                warnings.append(f"MLflow store {tracker.uri} did not take the metrics: kept in "
                                f"{tracker.spool_dir / (ref.run_id + '.jsonl')} (sent with the next log to that run)")
            return {"run_id": ref.run_id, "uri": tracker.uri, "step": int(ref.step or 0), "new_run": False}
        tracker = MlflowTracker(uri=tracking_uri, experiment=EVAL_EXPERIMENT)
        tags = {"benchmark": bench, "model": summary["model"]["path"] or "responses",
                "run_dir": summary["model"]["run_dir"] or "", "engine": str(gen["engine"])}
        params = {k: v for k, v in gen.items() if k not in ("engine_version",)}
        run_id = tracker.start(f"{bench}-n{gen['samples']}", tags, params)
        tracker.log_metrics(metrics, int(ref.step or 0) if ref is not None else 0)
        tracker.log_text(json.dumps(summary, indent=2), artifact)
        tracker.finish("FINISHED")
        return {"run_id": run_id, "uri": tracker.uri, "step": int(ref.step or 0) if ref else 0, "new_run": True}
    except TrackingError as e:
        warnings.append(f"not logged to MLflow ({str(e).splitlines()[0]}); the results are on disk")
        return None


def _require_out(out: Path, given: bool) -> None:
    """Raises EvalError when the output folder ``out`` cannot be made or written (before any compute)."""
    from vapo_lab.config.preflight import require_writable

    require_writable(out, f"--out {out}" if given else f"the output folder {out}",
                     "give --out a writable folder" if given else "run from a writable folder, or give --out one",
                     EvalError)


# -- responses generated elsewhere ---------------------------------------------------------------
def read_responses(path: str | Path, problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Returns sample records from a JSONL of responses: ``problem_id`` (or ``id``) and ``response``.

    Optional keys: ``sample_index`` (default: order of appearance per problem), ``length`` and
    ``finish_reason`` ("length" = truncated). Records come back in benchmark order.

    Raises:
        EvalError: a missing file, a malformed line, an unknown problem id, or a sample_index that is
            not one of 0..k-1 (k: the problem's responses) or repeats, named with its line.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"--responses {path} does not exist: give a JSONL file with problem_id and response keys")
    known = {p.id: p for p in problems}
    per_problem: dict[str, list[dict[str, Any]]] = {}
    line_of: dict[int, int] = {}  # id(record) -> its line
    for number, d in jsonl_objects(path, EvalError):
        pid = d.get("problem_id", d.get("id"))
        response = d.get("response")
        if pid is None or not isinstance(response, str):
            raise EvalError(f"{path}:{number}: needs a problem_id (or id) and a response string")
        pid = str(pid)
        if pid not in known:
            import difflib

            close = difflib.get_close_matches(pid, list(known), n=1)
            hint = f"did you mean {close[0]}?" if close else f"its ids look like {', '.join(list(known)[:3])}"
            raise EvalError(f"{path}:{number}: problem_id {pid!r} is not in the benchmark ({hint}); use the "
                            "benchmark's problem ids")
        rows = per_problem.setdefault(pid, [])
        index = d.get("sample_index", len(rows))
        if isinstance(index, float) and index.is_integer():
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int):
            raise EvalError(f"{path}:{number}: sample_index {index!r} is not an integer: number each problem's "
                            "responses 0, 1, 2, ..., or leave sample_index out (order of appearance)")
        rows.append({"problem_id": pid, "sample_index": index, "prompt": d.get("prompt"),
                     "response": response, "extracted_answer": None, "reference": known[pid].answer,
                     "correct": False, "length": d.get("length"), "finish_reason": d.get("finish_reason")})
        line_of[id(rows[-1])] = number
    for pid, rows in per_problem.items():  # each problem's k responses are numbered 0..k-1, each once
        seen: dict[int, int] = {}
        for r in rows:
            index, number = r["sample_index"], line_of[id(r)]
            if not 0 <= index < len(rows):
                raise EvalError(f"{path}:{number}: sample_index {index} is out of range: problem {pid} has {len(rows)} "
                                f"responses, numbered 0..{len(rows) - 1}, each once; renumber them, or leave "
                                "sample_index out (order of appearance)")
            if index in seen:
                raise EvalError(f"{path}:{number}: sample_index {index} of problem {pid} is given twice (also on line "
                                f"{seen[index]}); number its responses 0..{len(rows) - 1}, each once, or leave "
                                "sample_index out (order of appearance)")
            seen[index] = number
    return [r for p in problems for r in sorted(per_problem.get(p.id, []), key=lambda r: r["sample_index"])]


def grade_responses(
    bench: str | None,
    responses: str | Path,
    data: str | Path | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
    model: str | Path | None = None,
    step: int | None = None,
    settings: EvalSettings = EvalSettings(),
    out_dir: str | Path | None = None,
    runs_dir: str | Path = "runs",
    track: bool = True,
    tracking_uri: str | None = None,
) -> EvalResult:
    """Returns the graded evaluation of responses generated elsewhere (any engine), with no model.

    The benchmark's references and grader are those of ``evaluate_model``; arith needs ``model``
    (or a latest run) for its task. Writes ``samples.jsonl`` (graded) and ``summary.json``.
    """
    check_settings(settings)
    check_benchmark(bench, data)
    ref = resolve_model(model, step, runs_dir, tracking_uri) if (bench == ARITH or model is not None) else None
    bch = load_eval_bench(bench, ref, data, problem_key, answer_key)
    out = Path(out_dir) if out_dir is not None else Path("evals") / (
        f"{_UNSAFE.sub('_', bch.name).replace('/', '_')}-responses-{Path(responses).stem}")
    _require_out(out, out_dir is not None)
    records = read_responses(responses, bch.problems)
    if not records:
        raise EvalError(f"--responses {responses} holds no response")
    t0 = time.perf_counter()
    grade_records(records, bch, {p.id: p for p in bch.problems}, settings)
    t_grade = time.perf_counter() - t0
    metrics, rows = compute_metrics(records, bch.problems, bch.integer_answers)
    warnings = []
    if metrics["problems_graded"] < len(bch.problems):
        warnings.append(f"{len(bch.problems) - metrics['problems_graded']} of {len(bch.problems)} problems have no "
                        "response: metrics are over the graded ones only")
    bad = {k: v for k, v in metrics["grade_status"].items() if k in ("timeout", "error")}
    if bad:
        warnings.append(f"grading: {', '.join(f'{v} {k}' for k, v in bad.items())} (counted wrong)")
    n = metrics["samples_per_problem"]
    n = n if isinstance(n, int) else n["min"]
    out.mkdir(parents=True, exist_ok=True)
    (out / SAMPLES_FILE).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                    encoding="utf-8")
    summary = {
        "benchmark": {"name": bch.name, "source": bch.source, "problems": len(bch.problems),
                      "integer_answers": bch.integer_answers, "fingerprint": _fingerprint(bch.problems)},
        "model": ref.describe() if ref is not None else {"name": None, "path": None, "run_dir": None,
                                                         "run_id": None, "checkpoint": None, "step": None},
        "generation": {"engine": "external", "responses": str(Path(responses).resolve()), "samples": n, "seed": None},
        "grading": {**_grader_settings(bch, settings), "bootstrap": {"level": 0.95, "resamples": BOOTSTRAP_RESAMPLES,
                                                                      "seed": BOOTSTRAP_SEED, "unit": "problem"}},
        "metrics": metrics, "per_problem": rows, "timing": {"grade_s": t_grade},
        "files": {"samples": str(out / SAMPLES_FILE)}, "warnings": warnings,
    }
    summary["tracking"] = log_metrics_to_mlflow(summary, ref, bch.name, tracking_uri, warnings) if track else None
    _write_json(out / SUMMARY_FILE, summary)
    return EvalResult(out, summary, warnings)


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MATH_TEMPLATE",
    "EvalBench",
    "EvalError",
    "EvalResult",
    "EvalSettings",
    "ModelRef",
    "compute_metrics",
    "evaluate_model",
    "grade_responses",
    "load_eval_bench",
    "metric_names",
    "read_responses",
    "resolve_model",
]
