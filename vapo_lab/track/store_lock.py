"""One process at a time opens a local sqlite MLflow store.

MLflow creates a fresh sqlite store's schema (dozens of alembic migrations) when a client first
opens it, with no lock of its own: two runs started together in a fresh folder both migrate it and
one dies (``table ... already exists``, ``Online migration expected to match one row``). Opening
the store under an exclusive file lock beside it (``mlflow.db.lock``) makes the first process
create the schema and the others find it made. The lock is the OS's (flock): a process that dies
holding it releases it.

A process killed while it creates the schema leaves a store MLflow cannot open or finish
(``duplicate column name``, a leftover ``_alembic_tmp_`` table). Such a store holds nothing yet: no
run, no experiment but MLflow's Default. :func:`set_aside_if_empty` renames it (never deletes it) so
that the opener can create a fresh one; a store that holds anything is left for its owner to repair.
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
    """Holds an exclusive lock on ``<database>.lock`` while the body opens the store at ``uri`` (a
    sqlite one; any other store, or a folder the lock cannot be made in, goes without a lock and
    leaves MLflow to report the problem)."""
    path = sqlite_file(uri)
    if path is None or fcntl is None:
        yield
        return
    try:
        handle = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 - held across the yield
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
    """Renames the sqlite store of ``uri`` (and its journal files) to ``<name>.unfinished-<time>`` if
    it holds nothing, no run and no experiment but Default (a schema creation killed midway), and
    returns the new name; None, leaving it as it is, for any other store or one that holds anything
    or cannot be read. Call it under :func:`store_lock`, after the store failed to open."""
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
    """True when the sqlite file ``path`` has no row in any table but MLflow's schema version and its
    Default experiment (id 0); False when it has one, or cannot be read as sqlite."""
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
