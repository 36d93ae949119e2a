"""How an evaluation samples and grades: ``EvalSettings``, their check, the protocol's defaults.

The defaults are the paper's AIME protocol (VAPO §4, avg@32: temperature 1.0, top_p 0.7, a
``\\boxed{}`` answer). ``EvalError`` is the one error of the evaluation package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vapo_lab.conf import options
from vapo_lab.errors import VapoLabError

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
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


class EvalError(VapoLabError):
    """An evaluation cannot start or resume: a bad model, benchmark, file or setting."""


def mlflow_safe(name: str) -> str:
    """Returns ``name`` with every character MLflow refuses in a metric name replaced by ``_``."""
    return _UNSAFE.sub("_", name)


def file_safe(name: str) -> str:
    """Returns ``name`` as one path component: ``mlflow_safe``, with ``/`` replaced by ``_`` too."""
    return mlflow_safe(name).replace("/", "_")


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
            (``seeds.heldout_seed``), else 0.
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
    backends = options("rollout")  # the rollout engines, one per conf/rollout/ option
    if s.backend not in backends:
        problems.append(f"--backend {s.backend}: use {' or '.join(backends)}")
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


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MATH_TEMPLATE",
    "EvalError",
    "EvalSettings",
    "check_settings",
    "file_safe",
    "mlflow_safe",
]
