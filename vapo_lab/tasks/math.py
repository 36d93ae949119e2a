r"""A math task on real data: JSONL or Parquet problems with reference answers, graded with
math-verify.

Reads the plain format ``{"problem": ..., "answer": ...}`` (keys configurable: GSM8K uses
``question``) and DAPO-Math-17k's ``{"prompt": [{"role": "user", "content": ...}],
"reward_model": {"ground_truth": ...}}``, as it ships (Parquet) or as JSONL. A malformed line or
row is reported with its file and number before any compute. The response's final answer is the last
``\boxed{}`` (or an ``Answer:`` line, DAPO's format), compared with the reference by math-verify's
symbolic equivalence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vapo_lab.errors import ConfigError
from vapo_lab.grading import grade
from vapo_lab.tasks import Problem, records


def _field(record: dict[str, Any], key: str) -> Any:
    """Returns record[key], following dotted keys and DAPO's chat/ground-truth layout."""
    if key in record:
        value = record[key]
    elif key == "problem" and isinstance(record.get("prompt"), list):
        value = next((m.get("content") for m in record["prompt"] if m.get("role") == "user"), None)
    elif key == "answer" and isinstance(record.get("reward_model"), dict):
        value = record["reward_model"].get("ground_truth")
    else:
        value = record
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, list) and value and isinstance(value[0], dict):  # chat messages
        value = next((m.get("content") for m in value if m.get("role") == "user"), None)
    return value


def load_jsonl(
    path: str | Path,
    problem_key: str = "problem",
    answer_key: str = "answer",
    limit: int = -1,
    prefix: str = "",
) -> list[Problem]:
    """Returns the problems of a JSONL or Parquet (``.parquet``) file; a bad line or row raises
    ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"data file {path} does not exist: set task.train_path / task.eval_path to a JSONL or "
            "Parquet file"
        )
    problems: list[Problem] = []
    for number, record in records(path, ConfigError):
        problem, answer = _field(record, problem_key), _field(record, answer_key)
        if not isinstance(problem, str) or answer is None:
            raise ConfigError(
                f"{path}:{number}: no {problem_key!r} text or no {answer_key!r} value; set "
                "task.problem_key / task.answer_key to the file's field names"
            )
        pid = str(record.get("id", f"{prefix}{number}"))
        problems.append(Problem(id=pid, prompt=problem, answer=str(answer), meta={"line": number}))
        if 0 < limit <= len(problems):
            break
    if not problems:
        raise ConfigError(f"{path} holds no problems")
    return problems


class MathTask:
    """Problems from JSONL files; reward from math-verify equivalence of the final answer."""

    name = "math"

    def __init__(
        self,
        seed: int,
        n_train: int,
        n_eval: int,
        train_path: str | None = None,
        eval_path: str | None = None,
        problem_key: str = "problem",
        answer_key: str = "answer",
        prompt_template: str = "{problem}",
        **options: Any,
    ) -> None:
        if options:
            raise ConfigError(f"task.options has {sorted(options)}, which task math does not know")
        if not train_path:
            raise ConfigError("task.train_path is required for task=math: set it to a JSONL file")
        if "{problem}" not in prompt_template:
            raise ConfigError("task.prompt_template must contain {problem}")
        train = load_jsonl(train_path, problem_key, answer_key, prefix="train-")
        if eval_path:
            held = load_jsonl(eval_path, problem_key, answer_key, prefix="eval-")
        else:  # hold out the last n_eval problems of the training file
            if n_eval <= 0 or n_eval >= len(train):
                raise ConfigError(
                    f"task.n_eval={n_eval} must be in (0, {len(train)}) without task.eval_path"
                )
            train, held = train[:-n_eval], train[-n_eval:]
        if n_eval > 0:
            held = held[:n_eval]
        if n_train > 0:
            train = train[:n_train]

        def render(p: Problem) -> Problem:
            return Problem(p.id, prompt_template.format(problem=p.prompt), p.answer, p.meta)

        self.train, self.eval = [render(p) for p in train], [render(p) for p in held]
        self.seed = seed

    def verify(self, response_text: str, problem: Problem) -> bool:
        """Returns True iff the response's final answer equals the reference (vapo_lab.grading)."""
        return grade(response_text, problem.answer)


__all__ = ["MathTask", "load_jsonl"]
