"""Pre-flight checks: the folders and the tracking store a command will write, checked before any
compute.

A run writes its folder under ``output_dir``, the shared caches under ``./.vapo_cache`` and, with
``tracking=mlflow``, an MLflow store (``./mlflow.db`` by default). Each of these failing after a
two-minute base build is a waste; here each is tried first, cheaply, and nothing is left behind:
a folder is probed by creating and removing one temporary file in it (or in its nearest existing
parent, where the folder does not exist yet), a server by its ``/health`` endpoint. Every check
returns its problems as lines (empty when fine); ``require`` raises them all at once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vapo_lab.config.plan import fit_problems
from vapo_lab.errors import ConfigError, VapoLabError
from vapo_lab.runs.folder import run_name_taken


@dataclass(frozen=True)
class Need:
    """A path a command will write: ``what`` names it as the user set it, ``fix`` says how to move
    it."""

    path: Path
    what: str  # e.g. "output_dir=runs"
    fix: str  # e.g. "set output_dir=/a/writable/folder"


def unwritable(path: str | Path) -> tuple[Path, str] | None:
    """Returns (the folder that blocks it, why) when ``path`` (a folder, made if missing) cannot be
    written, else None. Creates and removes one temporary file in ``path`` or its nearest existing
    parent."""
    target = Path(path).absolute()
    folder = target
    while not folder.exists() and folder != folder.parent:  # the nearest existing parent
        folder = folder.parent
    if not folder.is_dir():
        return folder, f"{folder} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".vapo-lab-probe-", dir=folder)
    except OSError as e:
        return folder, f"{folder} is not writable ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def writable_problems(needs: Sequence[Need]) -> list[str]:
    """Returns one line per folder that blocks some of ``needs``, naming what goes there and each
    fix."""
    blocked: dict[Path, tuple[str, list[Need]]] = {}
    for need in needs:
        found = unwritable(need.path)
        if found is not None:
            blocked.setdefault(found[0], (found[1], []))[1].append(need)
    lines = []
    for folder, (why, group) in blocked.items():
        fixes = list(dict.fromkeys(n.fix for n in group))
        if len(group) == 1:
            lines.append(f"{group[0].what} cannot be written: {why}; {fixes[0]}")
        else:
            whats = ", ".join(n.what for n in group[:-1]) + f" and {group[-1].what}"
            lines.append(f"{why}, and {whats} are written there: {'; '.join(fixes)}")
    return lines


def require(problems: Sequence[str], error: type[VapoLabError] = ConfigError) -> None:
    """Raises ``error`` with every problem, one per line, when there is any."""
    if problems:
        raise error("\n".join(problems))


# -- the tracking store --------------------------------------------------------------------------
def store_path(uri: str) -> tuple[str, Path | None]:
    """Returns (kind, local path) of a resolved MLflow tracking URI: kind sqlite (the database
    file), file (the store folder), server (http/https; no path) or other (not checked)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        return "server", None
    if parsed.scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db (SQLAlchemy); sqlite:// is in memory
        rest = uri[len("sqlite://") :].split("?", 1)[0]
        return (
            ("sqlite", Path(rest[1:]))
            if rest.startswith("/") and len(rest) > 1
            else ("other", None)
        )
    if parsed.scheme == "file":
        return "file", Path(parsed.path)
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (a Windows drive letter too)
        return "file", Path(uri)
    return "other", None


def tracking_problems(
    uri: str | None, key: str = "tracking.uri", must_exist: bool = False, timeout: float = 3.0
) -> list[str]:
    """Returns the problems of the MLflow store ``uri`` (None: $MLFLOW_TRACKING_URI, else
    ./mlflow.db).

    Args:
        uri: the tracking URI as given.
        key: how the user sets it (tracking.uri, --tracking-uri), named in the fix.
        must_exist: for reading (``vapo-lab report``): a local store must already exist; it is
            never created. Otherwise a local store must be creatable and writable.
        timeout: seconds to wait for a server's /health.
    """
    from vapo_lab.track.store import TrackingError, check_server, resolve_tracking_uri

    resolved = resolve_tracking_uri(uri)
    shown = (
        (f"{key} {resolved}" if key.startswith("--") else f"{key}={resolved}")
        if uri
        else f"the default tracking store {resolved}"
    )
    kind, path = store_path(resolved)
    if kind == "server":
        try:
            check_server(resolved, timeout=timeout)
        except TrackingError as e:
            if key == "tracking.uri":
                return [str(e)]
            return [
                str(e).replace("set tracking.uri", f"give {key}").replace(", or tracking=none", "")
            ]
        return []
    if path is None:
        return []
    if must_exist:
        if kind == "sqlite" and not path.is_file():
            return [
                f"{shown} does not exist (no file {path.absolute()}): give --tracking-uri the "
                "store the runs "
                "logged to (their run.json says which), e.g. sqlite:///mlflow.db in the folder "
                "they ran from"
            ]
        if kind == "file" and not path.is_dir():
            return [
                f"{shown} does not exist (no folder {path.absolute()}): give --tracking-uri the "
                "store the "
                "runs logged to (their run.json says which)"
            ]
        return []
    fix = (
        (
            f"set {key} to a store in a writable folder (e.g. {key}=sqlite:////tmp/mlflow.db), "
            "or tracking=none"
        )
        if key == "tracking.uri"
        else f"give {key} a store in a writable folder"
    )
    if kind == "sqlite" and path.exists() and not path.is_file():
        return [f"{shown} is not a database: {path} is a folder; {fix}"]
    if kind == "sqlite" and path.is_file() and not os.access(path, os.R_OK | os.W_OK):
        return [f"{shown} cannot be written: {path} is read-only; {fix}"]
    # SQLite also writes a journal beside the database; MLflow makes missing parent folders
    return writable_problems([Need(path.parent if kind == "sqlite" else path, shown, fix)])


# -- a training run ------------------------------------------------------------------------------
def run_problems(cfg: Any, cache_dir: str | Path) -> list[str]:
    """Returns the problems of where the run ``cfg`` will write: its folder (under ``output_dir``,
    or ``resume``), ``cache_dir`` (the shared caches, relative to the working directory) and the
    tracking store; folders that share a blocked parent are named on one line."""
    folders, tracking = _run_problems(cfg, cache_dir)
    return folders + tracking


def _run_problems(cfg: Any, cache_dir: str | Path) -> tuple[list[str], list[str]]:
    """Returns (problems of folders, including a local store's, problems of a tracking server)."""
    needs = [
        Need(Path(cache_dir), f"the caches in {cache_dir}", "run vapo-lab from a writable folder")
    ]
    if cfg.resume:
        needs.append(
            Need(
                Path(cfg.resume),
                f"resume={cfg.resume}",
                "copy the run to a writable folder and resume it there",
            )
        )
    else:
        needs.append(
            Need(
                Path(cfg.output_dir),
                f"output_dir={cfg.output_dir}",
                "set output_dir=/a/writable/folder",
            )
        )
    store: list[str] = []  # an existing database's own problems
    name = cfg.get("run_name")
    if not cfg.resume and name and (Path(cfg.output_dir) / name).exists():
        store.append(run_name_taken(name, Path(cfg.output_dir) / name))
    server: list[str] = []
    if cfg.tracking.backend == "mlflow":
        from vapo_lab.track.store import resolve_tracking_uri

        resolved = resolve_tracking_uri(cfg.tracking.uri)
        kind, path = store_path(resolved)
        if kind == "server":
            server = tracking_problems(cfg.tracking.uri)
        elif kind == "sqlite" and path is not None and path.exists():
            store = tracking_problems(cfg.tracking.uri)
        elif path is not None:  # a local store, made on first use: its folder joins the others
            shown = (
                f"tracking.uri={resolved}" if cfg.tracking.uri else f"the MLflow store {path.name}"
            )
            needs.append(
                Need(
                    path.parent if kind == "sqlite" else path,
                    shown,
                    "set tracking.uri=sqlite:////a/writable/folder/mlflow.db, or tracking=none",
                )
            )
    return writable_problems(needs) + store, server


def check_run(cfg: Any, cache_dir: str | Path) -> None:
    """Raises ConfigError naming every place the run ``cfg`` cannot write (see ``run_problems``)
    and, when it runs on this machine (launcher=local: ``train`` and local grids), a model and batch
    its devices cannot hold (``fit_problems``); TrackingError when the only problem is a tracking
    server that does not answer. Ray and Slurm cells run on other machines, whose devices this one
    cannot see."""
    from vapo_lab.track.store import TrackingError

    folders, tracking = _run_problems(cfg, cache_dir)
    if cfg.launcher.name == "local":
        folders += fit_problems(cfg)
    require(folders + tracking, ConfigError if folders else TrackingError)


def require_writable(
    path: str | Path, what: str, fix: str, error: type[VapoLabError] = ConfigError
) -> None:
    """Raises ``error`` when the folder ``path`` cannot be made or written, naming ``what`` and
    ``fix``."""
    require(writable_problems([Need(Path(path), what, fix)]), error)


__all__ = [
    "Need",
    "check_run",
    "require",
    "require_writable",
    "run_problems",
    "store_path",
    "tracking_problems",
    "unwritable",
    "writable_problems",
]
