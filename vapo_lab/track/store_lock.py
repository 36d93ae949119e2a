"""One process at a time opens a local sqlite MLflow store.

MLflow creates a fresh sqlite store's schema (dozens of alembic migrations) when a client first
opens it, with no lock of its own: two runs started together in a fresh folder both migrate it and
one dies (``table ... already exists``, ``Online migration expected to match one row``). Opening
the store under an exclusive file lock beside it (``mlflow.db.lock``) makes the first process
create the schema and the others find it made. The lock is the OS's (flock): a process that dies
holding it releases it.
"""

from __future__ import annotations

import contextlib
import re
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
