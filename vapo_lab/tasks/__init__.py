"""Verifiable tasks: the Problem record, the answer extractor and the task registry.

A task has ``.train`` and ``.eval`` (disjoint lists of :class:`Problem`) and
``.verify(response_text, problem) -> bool``, from which the rollout and evaluation alike make the
reward.
"""

from __future__ import annotations

import difflib
import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vapo_lab.errors import ConfigError

# the one answer extractor, shared with evaluation (re-exported: tasks.arith and tests use it)
from vapo_lab.grading import last_boxed


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt given to the policy and the reference answer the verifier checks."""

    id: str
    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


def jsonl_objects(path: Path, error: type[Exception]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (line number, object) for each non-blank line of the JSONL file ``path``.

    Raises:
        error: a line that is not UTF-8, not valid JSON or not a JSON object, named by file and
            line number.
    """
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                # a byte-order mark is no error
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise error(
                    f"{path}:{number}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1}); save it as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(
                    f"{path}:{number}: not valid JSON ({e.msg}); fix or remove that line"
                ) from None
            if not isinstance(record, dict):
                raise error(
                    f"{path}:{number}: a line must be a JSON object, not {type(record).__name__}"
                )
            yield number, record


def parquet_records(path: Path, error: type[Exception]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (row number, record) for each row of the Parquet file ``path`` (nested columns, e.g.
    DAPO-Math-17k's chat ``prompt``, as lists and dicts), a batch of rows at a time.

    Raises:
        error: the file is not a Parquet file pyarrow can read.
    """
    import pyarrow.parquet as pq
    from pyarrow import ArrowException

    try:
        table = pq.ParquetFile(path)
        number = 0
        for batch in table.iter_batches(batch_size=4096):
            for record in batch.to_pylist():
                number += 1
                yield number, record
    except (ArrowException, OSError) as e:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise error(f"{path}: not a Parquet file pyarrow can read ({detail})") from None


def records(path: Path, error: type[Exception]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (row or line number, record) of a ``.parquet`` file or of a JSONL file (any other
    name)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return parquet_records(path, error)
    return jsonl_objects(path, error)


# name -> "module:attribute" for the built-in tasks, imported on first use (a task may pull heavy
# dependencies, e.g. math-verify, that the others do not need).
_BUILTIN: dict[str, str] = {
    "arith": "vapo_lab.tasks.arith:ArithTask",
    "arithfree": "vapo_lab.tasks.arithfree:ArithFreeTask",
    "math": "vapo_lab.tasks.math:MathTask",
}
_REGISTERED: dict[str, Callable[..., Any]] = {}


def register_task(name: str, factory: Callable[..., Any]) -> Callable[..., Any]:
    """Returns ``factory`` after registering it as task ``name``; a taken name raises ValueError."""
    if name in _REGISTERED or name in _BUILTIN:
        raise ValueError(f"task {name!r} is already registered")
    _REGISTERED[name] = factory
    return factory


def task_names() -> list[str]:
    """Returns the names ``build_task`` accepts, built-ins first."""
    return list(_BUILTIN) + list(_REGISTERED)


def build_task(name: str, **kwargs: Any) -> Any:
    """Returns the task called ``name`` built with ``kwargs`` (e.g. seed, n_train, n_eval, options).

    Raises:
        ConfigError: ``name`` is not a registered task; the message lists the valid ones.
    """
    if name in _REGISTERED:
        return _REGISTERED[name](**kwargs)
    if name not in _BUILTIN:
        names = task_names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"task.name={name!r} is not a known task{hint}. "
            f"Set task.name to one of: {', '.join(names)}."
        )
    module, attr = _BUILTIN[name].split(":")
    return getattr(importlib.import_module(module), attr)(**kwargs)


__all__ = ["Problem", "build_task", "last_boxed", "register_task", "task_names"]
