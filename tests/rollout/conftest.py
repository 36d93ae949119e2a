"""Fixtures for the vLLM backend's tests on CPU: the stand-in ``vllm`` module and a tiny model to
serve."""

from __future__ import annotations

import fake_vllm
import pytest

# the trainer's small test configuration (tests/trainer/conftest.py SMALL), its model and task parts
SMALL = [
    "task.options.max_digits=3",
    "task.n_train=128",
    "task.n_eval=16",
    "model.arch.hidden_size=64",
    "model.arch.num_layers=2",
    "model.arch.intermediate_size=128",
    "rollout.responses_per_step=16",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "tracking=none",
]
ENGINE_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def vllm_config(*overrides: str):
    """Returns the composed config of a tiny run with rollout=vllm (SMALL, then ``overrides``)."""
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed

    return typed(compose_config(overrides=["rollout=vllm", *SMALL, *overrides]).cfg)


def save_tiny_model(cfg, path, seed: int = 0):
    """Saves the tiny model of ``cfg`` (initialised with ``seed``) and its tokenizer to ``path``, as
    the base-model build does; returns (model, tokenizer)."""
    from vapo_lab.models.tiny import build_tiny_model
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks import build_task

    c = cfg.task
    task = build_task(c.name, seed=int(c.seed), n_train=0, n_eval=0, **dict(c.options))
    tokenizer = build_tokenizer(task.vocabulary())
    a = cfg.model.arch
    model = build_tiny_model(
        tokenizer,
        hidden_size=int(a.hidden_size),
        num_layers=int(a.num_layers),
        num_heads=int(a.num_heads),
        num_kv_heads=int(a.num_kv_heads),
        intermediate_size=int(a.intermediate_size),
        max_position_embeddings=int(a.max_position_embeddings),
        seed=seed,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model.eval(), tokenizer


@pytest.fixture
def vllm_on_cpu(monkeypatch):
    """Installs the stand-in as ``vllm`` for one test; the variables the engine sets do not outlive
    it."""
    fake_vllm.install(monkeypatch)
    for var in ENGINE_ENV:
        # registers the restore (unset) that a bare delenv of an unset var would not
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    return fake_vllm


@pytest.fixture(scope="session")
def compose():
    """The config builder: ``compose(*overrides)`` is SMALL with rollout=vllm, then
    ``overrides``."""
    return vllm_config


@pytest.fixture(scope="session")
def save_tiny():
    """The model saver: ``save_tiny(cfg, path)`` writes cfg's tiny model and tokenizer to
    ``path``."""
    return save_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(config, model directory, policy, tokenizer): SMALL's tiny model of seed 0, saved with its
    tokenizer."""
    cfg = vllm_config()
    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = save_tiny_model(cfg, path)
    return cfg, path, model, tokenizer
