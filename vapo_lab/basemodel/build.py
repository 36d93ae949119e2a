"""Building and caching the embedded default's base model (its recipe: :mod:`.recipe`).

The result is cached under ``<cache_dir>/<hash of the config>/`` with ``save_pretrained`` (model
and tokenizer) plus ``base.json`` (config and measured accuracies). The lookup order is the
folder's cache, then the entry the package ships for the two embedded settings
(:data:`SHIPPED_DIR`, written by ``vapo-lab base ship``), then a build: a first run in a fresh
folder builds nothing and every machine starts RL from the same bits (docs/default-task.md,
Shipped cache entries).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vapo_lab.basemodel import freerecipe
from vapo_lab.basemodel.freerecipe import FREE_DEFAULTS
from vapo_lab.basemodel.freerecipe import TASK_NAME as FREE_TASK
from vapo_lab.basemodel.recipe import DEFAULTS, RECIPE_VERSION, measure_accuracy, pretrain
from vapo_lab.errors import ConfigError
from vapo_lab.integrity import CACHE_DIR, find_entry, manifest_problem, write_manifest
from vapo_lab.integrity import SHIPPED_DIR as SHIPPED_CACHE_DIR
from vapo_lab.models.tiny import build_tiny_model
from vapo_lab.models.tokenizer import build_tokenizer
from vapo_lab.tasks.arith import ArithTask

if TYPE_CHECKING:
    from vapo_lab.config.schema import ModelConfig, TaskConfig

DEFAULT_CACHE_DIR = CACHE_DIR / "base"
# base models shipped in the package, one folder per config hash, laid out as a cache entry
SHIPPED_DIR = SHIPPED_CACHE_DIR / "base"
META_FILE = "base.json"
# A progress-bar factory: called when a build starts, it returns a context manager that yields an
# object with rich.Progress's ``add_task`` / ``update`` (the command layer's bar), or None.
ProgressFactory = Callable[[], AbstractContextManager[Any]]


@dataclass(frozen=True)
class BaseModel:
    """Where a built base model lies and what it measured.

    Attributes:
        path: directory loadable with ``load_model_and_tokenizer`` (model + tokenizer).
        config: the build config (its hash names the directory).
        metrics: accuracies and timings measured at build time (see :func:`build_base`).
        cached: True when this call found the model already built (in the cache or shipped).
        shipped: True when it is the package's shipped model (``path`` under :data:`SHIPPED_DIR`).
    """

    path: Path
    config: dict[str, Any]
    metrics: dict[str, Any]
    cached: bool
    shipped: bool = False


def base_config(**overrides: Any) -> dict[str, Any]:
    """Returns the full build config: :func:`build_base`'s defaults with ``overrides`` applied
    (``task="arithfree"``: that task's, ``freerecipe.FREE_DEFAULTS``)."""
    config = dict(FREE_DEFAULTS if overrides.get("task") == FREE_TASK else DEFAULTS)
    unknown = sorted(set(overrides) - set(config))
    if unknown:
        raise ConfigError(
            f"unknown base-model options {unknown} (model.base.*): valid are {sorted(config)}"
        )
    config.update(overrides)
    return config


def config_hash(config: dict[str, Any]) -> str:
    """Returns a 16-hex-digit hash of ``config`` and the recipe version (the cache key)."""
    blob = json.dumps({"recipe": RECIPE_VERSION, **config}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_base(
    cache_dir: str | Path | None = None,
    *,
    force: bool = False,
    progress: ProgressFactory | None = None,
    num_threads: int | None = None,
    log: Callable[[str], None] | None = None,
    shipped_dir: str | Path | None = SHIPPED_DIR,
    **options: Any,
) -> BaseModel:
    """Returns the base model for ``options``, building and caching it on first use.

    ``options`` are keys of :data:`DEFAULTS` (from Hydra: the task's keys, ``model.arch.*`` and
    ``+model.base.<option>=...``); their hash names the entry, ``<cache_dir>/<config hash>/``.

    Args:
        cache_dir: where built models are kept; default ``.vapo_cache/base``.
        force: rebuild even if the cache has this config.
        progress: called once a build starts (not on a cache hit); returns the context manager
            of a progress bar with rich.Progress's ``add_task`` / ``update``, or yielding None.
        num_threads: torch CPU threads during the build, restored afterwards; None leaves the
            process's thread settings untouched (:func:`_threads`).
        log: told, in one line, when a cached or shipped entry fails its checksums.
        shipped_dir: the shipped models (None: none), used when the cache has no entry.

    Returns:
        the :class:`BaseModel`; its metrics hold ``accuracy`` -> {``greedy``, ``t1``} -> {``all``
        and one key per digit bucket, e.g. ``"6-10"``}, timings, parameter count, final loss and
        the response-length range in tokens (eos included).

    Raises:
        ConfigError: an unknown option.
    """
    config = base_config(**options)
    root = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    path = root / config_hash(config)
    found = (
        None
        if force
        else find_entry(path.name, "base model", root, shipped_dir and Path(shipped_dir), log)
    )
    if found is not None:
        meta = json.loads((found[0] / META_FILE).read_text())
        return BaseModel(
            path=found[0],
            config=meta["config"],
            metrics=meta["metrics"],
            cached=True,
            shipped=found[1],
        )

    build_start = time.perf_counter()
    with _threads(num_threads), progress() if progress is not None else nullcontext() as bar:
        free = config.get("task") == FREE_TASK  # task=arithfree: its own traces and measurement
        task = (
            freerecipe.make_task(config)
            if free
            else ArithTask(
                config["task_seed"],
                config["n_train"],
                config["n_eval"],
                min_digits=config["min_digits"],
                max_digits=config["max_digits"],
                length_exponent=config["length_exponent"],
                readout=config["readout"],
            )
        )
        tokenizer = build_tokenizer(task.vocabulary())
        model = build_tiny_model(
            tokenizer,
            hidden_size=config["hidden_size"],
            num_layers=config["num_layers"],
            num_heads=config["num_heads"],
            num_kv_heads=config["num_kv_heads"],
            intermediate_size=config["intermediate_size"],
            max_position_embeddings=config["max_position_embeddings"],
            rope_theta=config["rope_theta"],
            init_std=config["init_std"],
            seed=config["seed"],
        )
        start = time.perf_counter()
        view = freerecipe.PretrainView(task, freerecipe.length_choice(config)) if free else task
        final_loss = pretrain(model, tokenizer, view, config, bar)
        train_seconds = time.perf_counter() - start
        start = time.perf_counter()
        measure = freerecipe.measure if free else measure_accuracy
        accuracy = measure(
            model, tokenizer, task, task.eval, config["eval_samples"], config["seed"], bar
        )
        eval_seconds = time.perf_counter() - start

    lengths = [len(tokenizer(task.trace(p)).input_ids) + 1 for p in task.train + task.eval]  # + eos
    if free:  # the shortest response is a direct answer
        problems = task.train + task.eval
        lengths += [len(tokenizer(task.trace(p, columns=0)).input_ids) + 1 for p in problems]
    metrics = {
        "accuracy": accuracy,
        "final_loss": round(final_loss, 4),
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "build_seconds": round(time.perf_counter() - build_start, 1),
        "n_params": sum(p.numel() for p in model.parameters()),
        "response_tokens": {"min": min(lengths), "max": max(lengths)},
    }
    _save_atomically(path, model, tokenizer, {"config": config, "metrics": metrics})
    return BaseModel(path=path, config=config, metrics=metrics, cached=False)


def _save_atomically(path: Path, model, tokenizer, meta: dict[str, Any]) -> None:
    """Writes model, tokenizer and meta to a temporary sibling directory, then renames it ``path``.

    A crash leaves no half-written cache entry, and when two processes build the same config at
    once, the second keeps the first's copy.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        write_manifest(tmp)
        if path.exists():
            shutil.rmtree(path)  # force=True, or a stale entry without base.json
        try:
            os.replace(tmp, path)
        except OSError:
            if manifest_problem(path) is not None:  # not a concurrent build's complete copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _threads(n: int | None):
    """Sets torch's CPU thread count for the block, then restores it; with None, touches nothing.

    ``torch.set_num_threads`` pins MKL's threads even when the count does not change, and some
    kernels then round differently (gradients differ at 1e-8), so a run that built its base
    in-process would drift from the same run with the base cached.
    """
    if n is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def base_options_for(model: ModelConfig, task: TaskConfig) -> dict[str, Any]:
    """Returns the base-model build options of the task, ``model.arch`` and ``model.base``; their
    :func:`base_config` hashes to the cache key.

    Raises:
        ConfigError: no base model to build (not model=tiny on task=arith or arithfree).
    """
    if model.name != "tiny":
        raise ConfigError(
            f"model={model.name} loads its weights from model.path; only model=tiny "
            "has a base model to build"
        )
    if task.name not in ("arith", FREE_TASK):
        raise ConfigError(
            f"the tiny base model is pre-trained on task=arith or {FREE_TASK}, not "
            f"task={task.name}: use one of them, or a real model (model=hf model.path=...)"
        )
    shape = ("min_digits", "max_digits", "length_exponent", "readout")
    free = {"task": FREE_TASK} if task.name == FREE_TASK else {}
    options = dict(
        **free,
        task_seed=task.seed,
        n_train=task.n_train,
        n_eval=task.n_eval,
        **{k: task.options[k] for k in shape if k in task.options},
        **dataclasses.asdict(model.arch),
    )
    # model.base wins over the task's shape: a base pre-trained on another digit-count law
    options.update(model.base)
    return options


def build_base_for(
    model: ModelConfig,
    task: TaskConfig,
    progress: ProgressFactory | None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    threads: int | None = None,
) -> BaseModel:
    """Returns the embedded default's base model for these sections (a ``BaseModel``), building it
    on first use with ``threads`` torch threads (``progress``: see :func:`build_base`)."""
    return build_base(
        cache_dir=DEFAULT_CACHE_DIR,
        progress=progress,
        num_threads=threads,
        force=force,
        log=log,
        **base_options_for(model, task),
    )
