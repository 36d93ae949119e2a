"""Checksummed folders: a cache entry or checkpoint is used only if every byte is as written.

A writer calls :func:`write_manifest` last, after every other file of the folder is complete; it
records the SHA-256 and size of each file in ``manifest.json``. A reader calls
:func:`manifest_problem` before loading anything: a zeroed, truncated or edited file, a missing
file or a missing manifest is named, and the caller rebuilds (caches) or falls back to an older
folder (checkpoints) instead of loading it.

Cost: one full read of the folder per write and per check, noise beside a step at this scale
(docs/benchmarks.md, checksums); a multi-hundred-GB sharded checkpoint would want checksums per
shard, written by the rank that writes the shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from vapo_lab.names import inside

# the caches of the working folder (base model, reward model, pretrained critic), each checksummed
CACHE_DIR = Path(".vapo_cache")
# entries shipped in the package, in the caches' layout (<kind>/<key>/): looked up after the
# folder's own cache, so that a fresh folder starts the embedded settings from the same bits on
# every machine
SHIPPED_DIR = Path(__file__).resolve().with_name("shipped")
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """Returns the hex SHA-256 of the file at ``path``."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> None:
    """Writes ``folder/manifest.json``: {relative path: {sha256, bytes}} of every other file."""
    entries = {
        p.relative_to(folder).as_posix(): {"sha256": file_sha256(p), "bytes": p.stat().st_size}
        for p in _files(folder)
    }
    (folder / MANIFEST).write_text(
        json.dumps({"version": 1, "files": entries}, indent=1, sort_keys=True) + "\n"
    )


def manifest_problem(folder: Path) -> str | None:
    """Returns None when ``folder`` matches its manifest, else what is wrong (one short phrase).

    Every file listed must exist with the recorded size and SHA-256; a file the manifest does not
    list is ignored (e.g. a lock file), since nothing reads it.
    """
    path = folder / MANIFEST
    if not path.is_file():
        return f"{folder} has no {MANIFEST} (written by an older vapo-lab, or not completely)"
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{path} is unreadable"
    if not isinstance(files, dict):
        return f"{path} is unreadable"
    for name, entry in sorted(files.items()):
        f = inside(folder, name)
        if f is None:  # never opened: an entry may not point outside the folder it describes
            return f"{path} lists {name!r}, outside {folder}"
        if not isinstance(entry, dict) or not {"bytes", "sha256"} <= set(entry):
            return f"{path} is unreadable"
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != entry["bytes"]:
            return f"{f} has {f.stat().st_size} bytes, {entry['bytes']} were written"
        if file_sha256(f) != entry["sha256"]:
            return f"{f} does not match its checksum"
    return None


def find_entry(
    key: str,
    what: str,
    cache_dir: Path | None,
    shipped_dir: Path | None,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, bool] | None:
    """Returns (folder, shipped?) of the usable entry ``key``: ``<cache_dir>/<key>`` (the folder's
    cache of one kind, e.g. ``.vapo_cache/reward_model``) first, then ``<shipped_dir>/<key>`` (the
    package's, e.g. ``SHIPPED_DIR / "reward_model"``); None when neither has one that matches its
    checksums. A damaged entry is named to ``log`` in one line (``what``: e.g. "reward model").
    """
    for root, shipped in ((cache_dir, False), (shipped_dir, True)):
        if root is None:
            continue
        path = Path(root) / key
        if not path.is_dir():
            continue
        problem = manifest_problem(path)
        if problem is None:
            return path, shipped
        if log is not None:  # the caller then tries the shipped entry, else builds anew
            log(
                f"warning: the {'shipped' if shipped else 'cached'} {what} is unusable "
                f"({problem}): not using it"
            )
    return None


def ship_entry(entry: Path, shipped_dir: Path) -> Path:
    """Returns the shipped folder after copying the cache entry folder ``entry`` to
    ``<shipped_dir>/<its name>/`` (replacing one there; ``shipped_dir``: e.g. ``SHIPPED_DIR /
    "base"``), checked against its manifest before and after.

    Raises:
        ValueError: ``entry`` is already that folder, or its files (or the copy's) fail their
            checksums.
    """
    target = Path(shipped_dir) / entry.name
    if target.resolve() == Path(entry).resolve():
        raise ValueError(f"{entry} is the shipped entry itself: ship from a folder's .vapo_cache")
    problem = manifest_problem(entry)
    if problem is not None:
        raise ValueError(f"not shipping {entry}: {problem}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for f in Path(entry).iterdir():
            if f.is_file():
                shutil.copyfile(f, tmp / f.name)
        problem = manifest_problem(tmp)
        if problem is not None:
            raise ValueError(f"the copy of {entry} failed its checksums ({problem}): retry")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        target.chmod(0o755)  # mkdtemp's 0700 would keep other users of an installed copy out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
