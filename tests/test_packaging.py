"""Packaging: every subpackage ships, and conf/ ships inside the package as vapo_lab.conf."""

import tomllib
from pathlib import Path

import yaml

from vapo_lab.conf import conf_dir
from vapo_lab.registry.components import COMPONENTS

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
    # a group for each entry of config.yaml's defaults list and one for each component
    defaults = yaml.safe_load((conf_dir() / "config.yaml").read_text())["defaults"]
    listed = {next(iter(d)) for d in defaults if isinstance(d, dict)}
    groups = {p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert groups == listed | {c.name for c in COMPONENTS}
