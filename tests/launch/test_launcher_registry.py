"""The launchers' registry: the one list of launcher names, equal to conf/launcher/'s options."""

import pytest

from vapo_lab.conf import conf_dir
from vapo_lab.launch.base import Launcher, LaunchError
from vapo_lab.launch.registry import LAUNCHERS, resolve_launcher


def test_registry_names_are_the_launcher_config_options():
    assert sorted(LAUNCHERS.names()) == sorted(
        p.stem for p in (conf_dir() / "launcher").glob("*.yaml")
    )


def test_every_launcher_implements_the_protocol():
    assert all(isinstance(launcher, Launcher) for launcher in LAUNCHERS)
    # only Slurm's jobs outlive us
    assert [launcher.detached for launcher in LAUNCHERS] == [
        False,
        False,
        True,
    ]


def test_the_launcher_is_the_option_then_the_last_override_then_the_default():
    assert resolve_launcher("slurm", ["launcher=ray"]).name == "slurm"
    assert resolve_launcher(None, ["launcher=slurm", "seed=1", "launcher=ray"]).name == "ray"
    assert resolve_launcher(None, ["launcher.local.workers=2"]).name == "local"


@pytest.mark.parametrize("launcher, overrides", [("slrum", []), (None, ["launcher=slrum"])])
def test_an_unknown_launcher_names_the_valid_ones_and_the_closest(launcher, overrides):
    with pytest.raises(
        LaunchError,
        match="unknown launcher 'slrum': valid names are local, ray, slurm; did you mean slurm",
    ):
        resolve_launcher(launcher, overrides)
