"""Fault injection for the fault suite (``tests/faults/``): a process killed at a chosen point.

``VAPO_FAULT=<point>@<step>`` makes the trainer kill its own process with SIGKILL (no cleanup, no
``finally``, as a node failure or the OOM killer would) when it reaches ``<point>`` of training
step ``<step>``. The points: ``rollout`` (samples generated and graded, no update yet), ``update``
(the critic updated, the actor not yet), ``checkpoint`` (every file of the step's checkpoint
written, the rename that commits it not yet done). Unset, a point costs one comparison.
"""

from __future__ import annotations

import os
import signal

POINTS = ("rollout", "update", "checkpoint")
_SPEC = os.environ.get("VAPO_FAULT")


def point(name: str, step: int) -> None:
    """Kills this process if ``VAPO_FAULT`` names this point and step."""
    if _SPEC is not None and _SPEC == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
