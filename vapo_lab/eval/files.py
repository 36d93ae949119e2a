"""An evaluation's output folder: its files, resuming its samples, writing them safely.

``samples.jsonl`` holds one line per sample in benchmark order, each chunk of problems appended
whole after grading; ``settings.json``, written first, what the samples depend on (a resume must
match it); ``summary.json`` the settings, engine, metrics, per-problem results and timings.
``open_samples`` keeps the complete chunks it finds, so a rerun generates only the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vapo_lab.eval.model_ref import ModelRef
from vapo_lab.eval.settings import EvalError, file_safe

SAMPLES_FILE = "samples.jsonl"
SETTINGS_FILE = "settings.json"
SUMMARY_FILE = "summary.json"


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


def default_out_dir(bench: str, ref: ModelRef | None, samples: int, seed: int) -> Path:
    """Returns where results go by default: the run's ``eval/`` folder, else ``evals/``."""
    name = f"{file_safe(bench)}-n{samples}-seed{seed}"
    if ref is not None and ref.run_dir is not None:
        return ref.run_dir / "eval" / f"step{ref.step}-{name}"
    model = ref.path.resolve().name if ref is not None else "responses"
    return Path("evals") / f"{model}-{name}"


def require_out(out: Path, given: bool) -> None:
    """Raises EvalError when the output folder ``out`` cannot be made or written."""
    from vapo_lab.config.preflight import require_writable

    require_writable(
        out,
        f"--out {out}" if given else f"the output folder {out}",
        "give --out a writable folder"
        if given
        else "run from a writable folder, or give --out one",
        EvalError,
    )


def chunks(n_problems: int, per_chunk: int) -> list[range]:
    """Returns the problem index ranges of the generation chunks."""
    return [range(i, min(i + per_chunk, n_problems)) for i in range(0, n_problems, per_chunk)]


def open_samples(
    out: Path,
    key: dict[str, Any],
    problem_chunks: Sequence[range],
    n: int,
    problem_ids: Sequence[str],
    overwrite: bool,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], int]:
    """Returns (the records of the complete chunks already in ``out``, how many chunks that is).

    Makes ``out`` (``overwrite``: deletes earlier files first). A new samples file starts with
    ``settings.json`` = ``key``; an existing one must have been written with ``key`` and hold
    ``n`` samples per problem of ``problem_ids``, chunk by chunk, in order; what follows its last
    complete chunk is cut off.

    Raises:
        EvalError: the samples file was written with other settings, or does not hold them in order.
    """
    out.mkdir(parents=True, exist_ok=True)
    samples_path = out / SAMPLES_FILE
    if overwrite:
        for name in (SAMPLES_FILE, SETTINGS_FILE, SUMMARY_FILE):
            (out / name).unlink(missing_ok=True)
    if not samples_path.exists():
        write_json(out / SETTINGS_FILE, key)
        return [], 0
    _check_resume(out, key)
    records, ends = _read_records(samples_path)
    done_rows = 0
    complete = 0
    for c in problem_chunks:  # whole chunks only, in order
        if len(records) < done_rows + len(c) * n:
            break
        done_rows += len(c) * n
        complete += 1
    expected = [(problem_ids[i], j) for c in problem_chunks[:complete] for i in c for j in range(n)]
    if [(r.get("problem_id"), r.get("sample_index")) for r in records[:done_rows]] != expected:
        raise EvalError(
            f"{samples_path} does not hold the samples these settings give, in order: it was "
            "edited or written by another version; pass --overwrite, or another --out"
        )
    with samples_path.open("r+b") as f:  # drop a torn or partial last chunk
        f.truncate(ends[done_rows - 1] if done_rows else 0)
    if complete:
        log(
            f"resuming {samples_path}: {complete} of {len(problem_chunks)} chunks "
            f"({done_rows} samples) already done"
        )
    return records[:done_rows], complete


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
        raise EvalError(
            f"{out_dir / SAMPLES_FILE} exists without its {SETTINGS_FILE}: its settings are "
            "unknown, so it cannot be resumed; pass --overwrite, or another --out"
        )
    saved = json.loads(saved_path.read_text())
    diff = [k for k in sorted(set(saved) | set(settings)) if saved.get(k) != settings.get(k)]
    if diff:
        shown = ", ".join(
            f"{k}={_short(saved.get(k))} (now {_short(settings.get(k))})" for k in diff
        )
        raise EvalError(
            f"{out_dir / SAMPLES_FILE} was written with other settings: {shown}; rerun with the "
            "same settings to resume it, or pass --overwrite, or another --out"
        )


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonl(records: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Appends ``records`` as JSON lines in one write, flushed to disk: a chunk lands whole or
    torn."""
    blob = _jsonl(records)
    with path.open("a", encoding="utf-8") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def write_records(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Writes ``records`` as the JSON lines of ``path`` (replacing it)."""
    path.write_text(_jsonl(records), encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    """Writes JSON atomically (temporary file, then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


__all__ = [
    "SAMPLES_FILE",
    "SETTINGS_FILE",
    "SUMMARY_FILE",
    "EvalResult",
    "append_records",
    "chunks",
    "default_out_dir",
    "open_samples",
    "require_out",
    "write_json",
    "write_records",
]
