"""One process at a time opens a local sqlite MLflow store.

MLflow creates a fresh store's schema on first open with no lock of its own, so runs started
together in a fresh folder open it under an exclusive flock beside it (``mlflow.db.lock``). A store
whose schema creation was killed midway holds nothing and cannot be opened:
:func:`set_aside_if_empty` renames it (never deletes it) so that a fresh one can be made.
docs/grids.md, "Where runs log", has the failures this prevents.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no lock; start runs there one at a time
    fcntl = None  # type: ignore[assignment]

# sqlite:///relative.db, sqlite:////absolute/path.db, sqlite+pysqlite:///..., maybe ?options
_SQLITE = re.compile(r"^sqlite(\+\w+)?:///(?P<path>[^?]*)")


def sqlite_file(uri: str) -> Path | None:
    """Returns the database file of a sqlite URI; None for any other store or an in-memory one."""
    match = _SQLITE.match(uri)
    if match is None or match["path"] in ("", ":memory:"):
        return None
    return Path(match["path"])


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Holds an exclusive lock on ``<database>.lock`` while the body opens the sqlite store at
    ``uri``; any other store, or a folder the lock cannot be made in, goes without a lock (MLflow
    then reports the problem)."""
    path = sqlite_file(uri)
    if path is None or fcntl is None:
        yield
        return
    try:
        # held across the yield
        handle = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def set_aside_if_empty(uri: str) -> Path | None:
    """Returns the new name of the sqlite store of ``uri`` after renaming it (and its journal files)
    to ``<name>.unfinished-<time>``, when it holds nothing but MLflow's Default experiment (a schema
    creation killed midway); None, leaving it as it is, for any other store or one that holds
    anything or cannot be read. Call it under :func:`store_lock`, after the store failed to open."""
    path = sqlite_file(uri)
    if path is None or not path.is_file() or not _holds_nothing(path):
        return None
    aside = path.with_name(f"{path.name}.unfinished-{time.strftime('%Y%m%dT%H%M%S')}")
    for suffix in ("-journal", "-wal", "-shm"):  # sqlite's: they belong to the file they sit beside
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            extra.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside


def _holds_nothing(path: Path) -> bool:
    """True when the sqlite file ``path`` has no row in any table but MLflow's schema version and
    its Default experiment (id 0); False when it has one, or cannot be read as sqlite."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as db:
            tables = [
                r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            for table in tables:
                if table == "alembic_version" or table.startswith(("_alembic_tmp_", "sqlite_")):
                    continue
                where = " WHERE experiment_id != 0" if table == "experiments" else ""
                if db.execute(f'SELECT 1 FROM "{table}"{where} LIMIT 1').fetchone() is not None:
                    return False
    except sqlite3.Error:
        return False
    return True
