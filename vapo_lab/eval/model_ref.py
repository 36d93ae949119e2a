"""What ``--model`` names, resolved to files: a run's checkpoint, or a local model folder.

A vapo-lab run is named by its directory, one of its checkpoint folders or its MLflow run id; a
``save_pretrained`` folder (a Hugging Face model, or the embedded base with its ``base.json``) by
its path.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vapo_lab.config.schema import read_typed
from vapo_lab.eval.settings import EvalError
from vapo_lab.runs.checkpoint import latest_checkpoint
from vapo_lab.runs.find import checkpoint_step, checkpoints, latest_run, run_info, run_with_id
from vapo_lab.runs.folder import CHECKPOINTS, CONFIG_FILE, is_run_dir

_RUN_ID = re.compile(r"[0-9a-f]{32}")


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
        cfg: the run's saved config (config.yaml), typed.
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

    @property
    def trust_remote_code(self) -> bool:
        """The run's ``model.trust_remote_code``; False for a model outside a run."""
        return self.cfg.model.trust_remote_code if self.cfg is not None else False

    def describe(self) -> dict[str, Any]:
        """Returns the JSON-able record of the model for the summary."""
        name = (
            self.cfg.model.name
            if self.cfg is not None
            else ("tiny" if self.base_config is not None else "hf")
        )
        return {
            "name": str(name),
            "path": str(self.path.resolve()),
            "run_dir": str(self.run_dir.resolve()) if self.run_dir else None,
            "run_id": self.run_id,
            "checkpoint": str(self.checkpoint.resolve()) if self.checkpoint else None,
            "step": self.step,
        }


NO_MODEL = {
    "name": None,
    "path": None,
    "run_dir": None,
    "run_id": None,
    "checkpoint": None,
    "step": None,
}


def _find_run(run_id: str, runs_dir: Path, tracking_uri: str | None = None) -> Path:
    """Returns the run directory of tracking run ``run_id``: under ``runs_dir``, else by its MLflow
    tag."""
    found_here = run_with_id(run_id, runs_dir)
    if found_here is not None:
        return found_here
    found = None
    try:
        from vapo_lab.track import open_client, resolve_tracking_uri

        run = open_client(resolve_tracking_uri(tracking_uri)).get_run(run_id)
        found = run.data.tags.get("run_dir")
    except Exception:  # noqa: BLE001 - unknown id or unreachable store: the error below says both
        found = None
    if found and is_run_dir(found):
        return Path(found)
    raise EvalError(
        f"--model {run_id}: no run with this MLflow run id under {runs_dir}/ nor in the tracking "
        "store (or its run_dir tag points nowhere): give the run directory instead, "
        "e.g. runs/vapo-seed0-..."
    )


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_checkpoint(run_dir: Path, step: int | None) -> ModelRef:
    """Returns the ModelRef of a run's checkpoint at ``step`` (None: the latest)."""
    if not (run_dir / CONFIG_FILE).is_file():
        raise EvalError(
            f"{run_dir} has run.json but no config.yaml: not a complete vapo-lab run directory"
        )
    info = run_info(run_dir)
    cfg = read_typed(run_dir / CONFIG_FILE)
    found = checkpoints(run_dir)
    if step is None:
        # a damaged newest checkpoint is skipped for the one before, and the user is told which
        ckpt = latest_checkpoint(run_dir / CHECKPOINTS, warn=_warn)
        if ckpt is None:
            raise EvalError(
                f"run {run_dir} has no checkpoint yet (saved every trainer.save_every steps): "
                "wait for one, or evaluate a model folder with --model PATH"
            )
        step = checkpoint_step(ckpt)
    elif step not in found:
        have = ", ".join(str(s) for s in sorted(found)) or "none"
        raise EvalError(
            f"--step {step}: run {run_dir} has no checkpoint at step {step} (it has: {have}; "
            "trainer.keep keeps only the latest ones): choose one of those steps"
        )
    else:
        ckpt = found[step]
    policy = ckpt / "policy"
    if not (policy / "config.json").is_file():
        raise EvalError(
            f"checkpoint {ckpt} has no policy/config.json: it was not written by this vapo-lab "
            "(policies are saved with save_pretrained)"
        )
    tok = None
    if cfg.model.name != "tiny":
        tok = Path(cfg.model.tokenizer_path or cfg.model.path)
    return ModelRef(
        path=policy,
        tokenizer_path=tok,
        run_dir=run_dir,
        run_id=info.get("run_id"),
        tracking_uri=info.get("tracking_uri"),
        step=step,
        checkpoint=ckpt,
        cfg=cfg,
    )


def _model_folder(path: Path, step: int | None) -> ModelRef:
    """Returns the ModelRef of a ``save_pretrained`` folder outside any run (``step`` None)."""
    if step is not None:
        raise EvalError(
            f"--step {step} picks a checkpoint of a vapo-lab run, but --model {path} is a "
            "model folder: drop --step"
        )
    base_json = path / "base.json"
    base = json.loads(base_json.read_text())["config"] if base_json.is_file() else None
    return ModelRef(path=path, tokenizer_path=path, base_config=base)


def resolve_model(
    model: str | Path | None,
    step: int | None = None,
    runs_dir: str | Path = "runs",
    tracking_uri: str | None = None,
) -> ModelRef:
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
        latest = latest_run(runs_dir)
        if latest is None:
            raise EvalError(
                f"no vapo-lab run under {runs_dir}/ to evaluate: train one (`vapo-lab train`), "
                "or give --model a run directory, an MLflow run id or a local model folder"
            )
        return _run_checkpoint(latest, step)
    path = Path(model)
    if path.is_dir():
        if is_run_dir(path):
            return _run_checkpoint(path, step)
        if (path / "policy" / "config.json").is_file() and is_run_dir(path.parent.parent):
            ckpt_step = checkpoint_step(path)
            if step is not None and step != ckpt_step:
                raise EvalError(
                    f"--model {path} is the checkpoint of step {ckpt_step}, but --step {step} was "
                    "given: drop --step, or give the run directory"
                )
            return _run_checkpoint(path.parent.parent, ckpt_step)
        if (path / "config.json").is_file():
            return _model_folder(path, step)
        raise EvalError(
            f"--model {path} is a folder with neither run.json (a vapo-lab run) nor config.json "
            "(a save_pretrained model)"
        )
    if _RUN_ID.fullmatch(str(model)):
        return _run_checkpoint(_find_run(str(model), runs_dir, tracking_uri), step)
    raise EvalError(
        f"--model {model} does not exist: give a run directory (e.g. runs/vapo-seed0-...), its "
        "MLflow run id, or a local model folder with config.json"
    )


__all__ = ["NO_MODEL", "ModelRef", "resolve_model"]
