"""Packaging: every subpackage ships, and conf/ ships inside the package as vapo_lab.conf."""

import tomllib
from pathlib import Path

from vapo_lab.conf import conf_dir

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "vapo_lab").rglob("__init__.py")
    }
    assert listed == found | {"vapo_lab.conf", "vapo_lab.experiments"}


def test_conf_dir_is_the_repository_conf():
    assert (conf_dir() / "config.yaml").is_file()
    assert sorted(
        p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "__pycache__"
    ) == sorted(
        [
            "algo",
            "clip_higher",
            "decoupled_gae",
            "group_sampling",
            "launcher",
            "length_adaptive_gae",
            "model",
            "positive_lm_loss",
            "rollout",
            "scale",
            "task",
            "token_level_loss",
            "tracking",
            "trainer",
            "value_pretraining",
        ]
    )
