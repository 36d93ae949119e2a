"""What ``make_report`` returns: the folder, the files written, and what each part computed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Report:
    out: Path
    files: list[Path] = field(default_factory=list)
    table: list[dict[str, Any]] = field(default_factory=list)
    rank: dict[str, Any] = field(default_factory=dict)
    figure1: dict[str, Any] = field(default_factory=dict)
    figure2: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)  # figure stem -> what it plotted
    predictions: dict[str, Any] = field(default_factory=dict)  # the scored predictions, when given
