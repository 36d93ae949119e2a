"""The typed config reaches every phase: past the trainer's door no code re-types a config value
(``int(cfg.x)``), re-states a default (``cfg.get("x", d)``) or takes the whole untyped config."""

import ast
import inspect
from pathlib import Path

import pytest

import vapo_lab
from vapo_lab.config import schema

ROOT = Path(vapo_lab.__file__).parent
PHASES = ("trainer", "rollout", "eval")
SECTIONS = {
    name for name, obj in vars(schema).items() if inspect.isclass(obj) and name.endswith("Config")
}
CASTS = {"int", "float", "bool"}


def _root(node: ast.AST) -> ast.AST:
    """The innermost value of an attribute / subscript chain: ``a`` of ``a.b[0].c``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _config_names(fn: ast.AST) -> set[str]:
    """Names that hold config sections in ``fn``: parameters annotated with a schema class, the
    conventional ``cfg`` / ``config``, and locals assigned from either."""
    names = {"cfg", "config"}
    for arg in [*fn.args.args, *fn.args.kwonlyargs]:
        if arg.annotation is not None and any(s in ast.unparse(arg.annotation) for s in SECTIONS):
            names.add(arg.arg)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and _is_config(node.value, names):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_config(node: ast.AST, names: set[str]) -> bool:
    """True when ``node`` reads a config value: a chain rooted at a config name, at an attribute
    ``.cfg`` (``ref.cfg.seed``) or at ``self.config`` (a Hugging Face model's ``model.config`` is
    not ours)."""
    if not isinstance(node, (ast.Attribute, ast.Subscript, ast.Name)):
        return False
    probe = node
    while isinstance(probe, (ast.Attribute, ast.Subscript)):
        if isinstance(probe, ast.Attribute) and probe.attr == "cfg":
            return True
        if isinstance(probe, ast.Attribute) and probe.attr == "config":
            return isinstance(probe.value, ast.Name) and probe.value.id == "self"
        probe = probe.value
    return isinstance(probe, ast.Name) and probe.id in names


def offences(source: str) -> list[str]:
    """Returns each cast of a config value and each re-stated default in ``source``."""
    tree = ast.parse(source)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = _config_names(fn)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id in CASTS and node.args:
                if _is_config(node.args[0], names):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
            if isinstance(f, ast.Attribute) and f.attr == "get" and _is_config(f.value, names):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
            if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) == 3:
                if _is_config(node.args[0], names):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_finds_what_it_looks_for():
    # a by-hand example of each kind it must catch, and the typed forms it must let through
    bad = """
def f(rollout: RolloutConfig, cfg):
    a = int(rollout.max_new_tokens)
    b = float(cfg.trainer.actor_lr)
    c = cfg.trainer.get("adam_impl", "fused")
    t = cfg.trainer
    d = int(t.total_steps)
    e = getattr(self.config.trainer, "offload", False)
    g = int(ref.cfg.seed)
"""
    assert len(offences(bad)) == 6
    good = """
def f(rollout: RolloutConfig, batch):
    a = rollout.max_new_tokens
    b = int(batch.lengths.max())
    c = float(world.sum(x))
"""
    assert offences(good) == []


@pytest.mark.parametrize("package", PHASES)
def test_no_config_value_is_re_typed_or_re_defaulted_past_the_door(package):
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / package).rglob("*.py"))
        if (hits := offences(path.read_text()))
    }
    assert found == {}


def test_only_the_trainers_door_takes_the_untyped_config():
    takers = sorted(
        str(path.relative_to(ROOT))
        for package in PHASES
        for path in (ROOT / package).rglob("*.py")
        if "DictConfig" in path.read_text()
    )
    assert takers == ["trainer/trainer.py"]
