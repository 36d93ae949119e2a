"""One holder at a time: a grid's submitter (``<grid id>.lock`` beside its folder), a cell's runner
(``status/<cell key>.lock``), a cache entry's builder (``.vapo_cache/.locks/<kind>-<key>``).

An exclusive, non-blocking ``flock`` on a file that also says who holds it (host, pid, command,
since), so that the process refused is told whom it waits for. The kernel drops the lock when its
holder dies, however it dies: there is never a stale lock to clear by hand. Not POSIX (Windows):
no lock; submit a grid from one place at a time there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vapo_lab.errors import VapoLabError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]


class Busy(VapoLabError):
    """Another process holds the lock; the message names it and what to do."""


@contextlib.contextmanager
def exclusive(path: Path, what: str, fix: str) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` for the body.

    Args:
        what: what the lock guards, as the refusal names it, e.g. "grid table1-3326ff75".
        fix: what the refused process's user should do, e.g. "wait for it to end".

    Raises:
        Busy: another process holds it: "<what> is held by pid P on host H (<command>, since T):
            <fix>", one line.
    """
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # "a+": never truncates what the holder wrote before this process knows it holds the lock
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"{what} is held by {holder_text(path)}: {fix}") from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(_me()) + "\n")
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _me() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(["vapo-lab", *sys.argv[1:]])[:200],
        "since": time.time(),
    }


def holder_text(path: Path) -> str:
    """Returns who holds the lock ``path`` as its holder wrote it, e.g. "pid 4021 on host n1
    (vapo-lab sweep experiments/table1.yaml, since 09:45:03)"; "another process" when unreadable
    (its holder is writing it)."""
    try:
        h = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
        since = time.strftime("%H:%M:%S", time.localtime(float(h["since"])))
        return f"pid {int(h['pid'])} on host {h['host']} ({h['command']}, since {since})"
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return "another process"
