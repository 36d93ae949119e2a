"""Fault injection for the fault suite (``tests/faults/``): a process killed at a chosen point.

``VAPO_FAULT=<point>@<step>`` makes the trainer kill its own process with SIGKILL (no cleanup, no
``finally``, as a node failure or the OOM killer would) when it reaches ``<point>`` of training
step ``<step>``. The points: ``rollout`` (samples generated and graded, no update yet), ``update``
(the critic updated, the actor not yet), ``checkpoint`` (every file of the step's checkpoint
written, the rename that commits it not yet done). Unset, a point costs one comparison.

On many ranks every rank reads the same variable; ``VAPO_FAULT_RANK=<r>`` limits the fault to rank
r, and ``VAPO_FAULT_MODE=raise`` raises an error there instead of killing the process (a rank that
fails with a message, which the run must report as that rank's).
"""

from __future__ import annotations

import os
import signal

POINTS = ("rollout", "update", "checkpoint")
_SPEC = os.environ.get("VAPO_FAULT")
_RANK = os.environ.get("VAPO_FAULT_RANK")
_RAISE = os.environ.get("VAPO_FAULT_MODE") == "raise"


class InjectedFault(RuntimeError):
    """The error ``VAPO_FAULT_MODE=raise`` raises."""


def point(name: str, step: int) -> None:
    """Kills this process (or raises) if ``VAPO_FAULT`` names this point and step (and rank)."""
    if _SPEC is not None and _SPEC == f"{name}@{step}":
        if _RANK is not None and os.environ.get("RANK", "0") != _RANK:
            return
        if _RAISE:
            raise InjectedFault(f"injected fault at {name}@{step}")
        os.kill(os.getpid(), signal.SIGKILL)
