"""Tracking: MLflow (a local store by default, a server when given) or nothing, same methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vapo_lab.track.mlflow_tracker import MlflowTracker, NullTracker, flatten
from vapo_lab.track.store import TrackingError, open_client, resolve_tracking_uri

__all__ = [
    "MlflowTracker",
    "NullTracker",
    "TrackingError",
    "flatten",
    "make_tracker",
    "open_client",
    "resolve_tracking_uri",
]


def make_tracker(
    backend: str,
    uri: str | None = None,
    experiment: str = "vapo-lab",
    spool_dir: str | None = None,
    log: Callable[[str], None] | None = None,
) -> Any:
    """Returns the tracker for ``tracking.backend`` (mlflow | none); ``log`` hears of outages."""
    if backend == "none":
        return NullTracker()
    return MlflowTracker(uri=uri, experiment=experiment, spool_dir=spool_dir, log=log)
