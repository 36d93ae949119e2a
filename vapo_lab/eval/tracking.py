"""Where an evaluation's results go at the end: MLflow (optional) and ``summary.json``.

An unreachable MLflow store costs a warning, never the results on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vapo_lab.eval.files import SUMMARY_FILE, EvalResult, write_json
from vapo_lab.eval.model_ref import ModelRef
from vapo_lab.eval.scoring import metric_names
from vapo_lab.eval.settings import file_safe

EVAL_EXPERIMENT = "eval"


def log_metrics_to_mlflow(
    summary: dict[str, Any],
    ref: ModelRef | None,
    bench: str,
    tracking_uri: str | None,
    warnings: list[str],
) -> dict[str, Any] | None:
    """Returns where the ``eval/<bench>/...`` metrics were logged ({"run_id", "uri", "step",
    "new_run"}), or None with a warning when the store cannot be reached.

    They go into the training run at the checkpoint's step when the model is a checkpoint of a
    run tracked in MLflow, else to a new run in experiment ``eval``.
    """
    from vapo_lab.track import MlflowTracker, TrackingError

    metrics = metric_names(bench, summary["metrics"])
    gen = summary["generation"]
    artifact = (
        f"eval/{file_safe(bench)}-step{ref.step if ref else 0}"
        f"-n{gen['samples']}-seed{gen['seed']}.json"
    )
    try:
        if ref is not None and ref.run_id and ref.tracking_uri and ref.tracking_uri != "none":
            tracker = MlflowTracker(uri=ref.tracking_uri)
            tracker.run_id = ref.run_id  # log beside the training metrics; its status is left alone
            tracker.log_metrics(metrics, int(ref.step or 0))
            tracker.log_text(json.dumps(summary, indent=2), artifact)
            if tracker.failures:
                warnings.append(
                    f"MLflow store {tracker.uri} did not take the metrics: kept in "
                    f"{tracker.spool_dir / (ref.run_id + '.jsonl')} "
                    "(sent with the next log to that run)"
                )
            return {
                "run_id": ref.run_id,
                "uri": tracker.uri,
                "step": int(ref.step or 0),
                "new_run": False,
            }
        tracker = MlflowTracker(uri=tracking_uri, experiment=EVAL_EXPERIMENT)
        tags = {
            "benchmark": bench,
            "model": summary["model"]["path"] or "responses",
            "run_dir": summary["model"]["run_dir"] or "",
            "engine": str(gen["engine"]),
        }
        params = {k: v for k, v in gen.items() if k not in ("engine_version",)}
        run_id = tracker.start(f"{bench}-n{gen['samples']}", tags, params)
        tracker.log_metrics(metrics, int(ref.step or 0) if ref is not None else 0)
        tracker.log_text(json.dumps(summary, indent=2), artifact)
        tracker.finish("FINISHED")
        return {
            "run_id": run_id,
            "uri": tracker.uri,
            "step": int(ref.step or 0) if ref else 0,
            "new_run": True,
        }
    except TrackingError as e:
        warnings.append(f"not logged to MLflow ({str(e).splitlines()[0]}); the results are on disk")
        return None


def save_result(
    out: Path,
    summary: dict[str, Any],
    ref: ModelRef | None,
    bench: str,
    track: bool,
    tracking_uri: str | None,
) -> EvalResult:
    """Returns the evaluation's result after logging it to MLflow (when ``track``) and writing
    ``summary.json``, which records the tracking's warnings too."""
    warnings = summary["warnings"]
    summary["tracking"] = (
        log_metrics_to_mlflow(summary, ref, bench, tracking_uri, warnings) if track else None
    )
    write_json(out / SUMMARY_FILE, summary)
    return EvalResult(out, summary, warnings)


__all__ = ["EVAL_EXPERIMENT", "log_metrics_to_mlflow", "save_result"]
