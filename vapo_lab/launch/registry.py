"""The launchers by name: the one list of where a grid can run.

Each name is also a config option, ``conf/launcher/<name>.yaml``, holding that launcher's
settings (``launcher.<name>.*``); a test keeps the two lists equal. ``resolve_launcher`` decides,
once per submission and before any cell is composed, which launcher a command line asks for.
"""

from __future__ import annotations

from collections.abc import Sequence

from vapo_lab.conf import default_choice
from vapo_lab.launch.base import Launcher, LaunchError
from vapo_lab.launch.local import LocalLauncher
from vapo_lab.launch.ray import RayLauncher
from vapo_lab.launch.slurm import SlurmLauncher
from vapo_lab.registry import Registry

LAUNCHERS: Registry[Launcher] = Registry("launcher", error=LaunchError)
for _launcher in (LocalLauncher(), RayLauncher(), SlurmLauncher()):
    LAUNCHERS.register(_launcher)


def resolve_launcher(launcher: str | None, overrides: Sequence[str]) -> Launcher:
    """Returns the launcher a submission runs on: ``--launcher`` when given, else the last
    ``launcher=<name>`` of ``overrides``, else the config's default (conf/config.yaml).

    Raises:
        LaunchError: an unknown name, with the valid ones and the closest.
    """
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("launcher=")]
    name = (
        launcher if launcher is not None else chosen[-1] if chosen else default_choice("launcher")
    )
    return LAUNCHERS.get(name)
