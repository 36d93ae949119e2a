"""One rule for every name that becomes a path: run names, grid cell names, experiment names,
manifest entries.

A name a user types (``run_name=``, a grid file's cell ``name:``) is refused in one line, before
any folder is made, when it could leave its parent folder or break it: a path separator, ``.`` or
``..``, a control character, or more than ``MAX_NAME`` characters. A name that comes from a file
we only read (an experiment's name in a runs export) is turned into a safe slug instead.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

# characters of a name: run folders add "-<n>" and grid cells "-s<seed>-<hash8>" to it, and many
# file systems stop at 255 bytes a component
MAX_NAME = 100
_SLUG_DROP = re.compile(r"[^A-Za-z0-9_.+-]+")


def name_problem(name: str) -> str | None:
    """Returns what makes ``name`` unfit for a folder name (one phrase), or None."""
    if not name:
        return "it is empty"
    if len(name) > MAX_NAME:
        return f"it has {len(name)} characters, more than {MAX_NAME}"
    if "/" in name or "\\" in name:
        return "it holds a path separator (/ or \\)"
    if name in (".", ".."):
        return "it names a folder's own or parent folder"
    bad = next((c for c in name if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        return f"it holds the control character {bad!r}"
    return None


def check_name(name: str, what: str) -> str:
    """Returns ``name`` when it is fit for a folder name.

    Raises:
        ValueError: one line naming ``what`` (e.g. "run_name"), the problem and the fix.
    """
    problem = name_problem(name)
    if problem:
        raise ValueError(
            f"{what}={name!r} cannot name a folder: {problem}; use letters, digits, '.', '_', '-' "
            f"and '+' (at most {MAX_NAME} characters)"
        )
    return name


def slug(text: object) -> str:
    """Returns ``text`` as a safe folder name: runs of other characters than letters, digits and
    ``_.+-`` become ``_``, no leading dot, at most ``MAX_NAME`` characters, never empty. Names
    that are already safe come back as they are."""
    s = _SLUG_DROP.sub("_", str(text)).strip("_").lstrip(".")
    return s[:MAX_NAME] or "unnamed"


def inside(folder: Path, entry: str) -> Path | None:
    """Returns ``folder / entry`` when ``entry`` is a relative path that stays inside ``folder``
    (no absolute path, no ``..`` out of it, no symlink out of it), else None."""
    if not entry or PurePosixPath(entry).is_absolute() or Path(entry).is_absolute():
        return None
    target = (folder / entry).resolve()
    root = folder.resolve()
    return folder / entry if target == root or root in target.parents else None
