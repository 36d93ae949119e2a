"""The trainer sampling with the real vLLM engine (``rollout=vllm``, its CPU build): real updates
pushed into the engine each step, the engine's log-probs against the policy's recomputed ones,
and a run killed after a checkpoint and resumed, logging what an uninterrupted run logs.

The runs are GRPO on the embedded default's shipped base model loaded as a checkpoint (no base
model or critic to build), small: 4 steps of 16 responses, 8 held-out problems, through the CLI
as a user starts them.
"""

from __future__ import annotations

import json

import pytest

from tests.trainer.conftest import last_metrics
from tests.vllm.conftest import GRPO_RUN, train

pytestmark = pytest.mark.vllm

RUN = [
    *GRPO_RUN,
    "task.n_eval=8",
    "trainer.total_steps=4",
    "trainer.eval_every=2",
    "trainer.threads=2",
]


@pytest.fixture(scope="module")
def full(base, tmp_path_factory):
    """(working folder, the run's settings, {step: metrics}) of an uninterrupted run."""
    workdir = tmp_path_factory.mktemp("train")
    run = [*RUN, f"model.path={base[0]}"]
    done = train(workdir, *run, "run_name=full")
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir, run, last_metrics(workdir / "runs" / "full")


def test_the_engine_samples_what_the_updated_policy_would(full):
    _, _, metrics = full
    steps = [metrics[s] for s in range(1, 5)]
    for m in steps:
        # float32 on both sides: the engine's kernels against the policy's own forward pass
        assert m["diag/sampler/logprob_gap_max"] < 1e-3, m
        assert 1 - 1e-3 < m["diag/sampler/ratio_min"] <= m["diag/sampler/ratio_max"] < 1 + 1e-3
    # the policy moved (GRPO's KL to the reference grows from 0), and the engine followed it
    assert steps[-1]["actor/kl_loss"] > 0
    assert "eval/avg_at_2" in metrics[0] and "eval/avg_at_2" in metrics[4]


def test_a_run_killed_after_a_checkpoint_resumes_as_if_never_stopped(full):
    workdir, run, uninterrupted = full
    killed = train(workdir, *run, "run_name=killed", env={"VAPO_FAULT": "rollout@3"})
    assert killed.returncode != 0
    assert max(last_metrics(workdir / "runs" / "killed")) == 2
    resumed = train(workdir, "resume=runs/killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed" in resumed.stderr
    again = last_metrics(workdir / "runs" / "killed")
    assert sorted(again) == sorted(uninterrupted) == list(range(5))
    for step in range(5):
        a, b = (json.dumps(m[step], sort_keys=True) for m in (uninterrupted, again))
        assert a == b, step
