"""Two CPU ranks (gloo) sharing one real vLLM engine of tensor_parallel_size=2 (external_launcher):
the engine's lockstep contracts (rank_engine.py), and a run of FSDP2 with it, killed after a
checkpoint and resumed exactly, whose evaluation has one held-out problem (rank 1's share is
empty, and it samples beside rank 0 all the same)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.distributed.conftest import torchrun
from tests.trainer.conftest import last_metrics
from tests.vllm.conftest import GRPO_RUN, train
from vapo_lab.rollout.vllm_backend import VllmEngine

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    """({rank: what it saw}, what rank 0 saw sampling alone)."""
    path = tiny[0]
    out = tmp_path_factory.mktemp("pair")
    torchrun(2, HERE / "rank_engine.py", str(path), str(out), timeout=600)
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    return ranks, json.loads((out / "alone.json").read_text())


def test_a_push_from_fsdp2_shards_reaches_the_tensor_parallel_engine(pair):
    ranks, _ = pair
    for r in (0, 1):  # all-zero weights but the embeddings: every log-prob is -ln V
        assert ranks[r]["zero_max_gap"] < 1e-5, ranks[r]["zero_max_gap"]


def test_each_rank_gets_what_a_one_rank_engine_samples_for_its_prompts(pair, tiny):
    ranks, _ = pair
    path, model, tokenizer = tiny
    engine = VllmEngine(
        path, dtype="float32", seed=0, max_model_len=32, enforce_eager=True, seed_per_request=True
    )
    for r in (0, 1):
        got = ranks[r]["lockstep"]
        s = engine.sample(
            got["prompts"][::2],
            2,
            6,
            1.0,
            1.0,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            100 + 10 * r,
        )
        assert len(got["tokens"]) == 2 * (1 if r == 0 else 2)
        assert got["tokens"] == [
            s.response_ids[i, : int(s.lengths[i])].tolist() for i in range(len(s.lengths))
        ]
        for i, lps in enumerate(got["logprobs"]):
            want = s.logprobs[i, : int(s.lengths[i])]
            torch.testing.assert_close(torch.tensor(lps), want, rtol=0, atol=1e-4)
    # a rank without prompts: no rows back, while its partner's come back whole
    assert ranks[0]["no_prompts"]["tokens"] == [] and len(ranks[1]["no_prompts"]["tokens"]) == 4
    # each rank's own n in one group call (rank 0: 1 prompt x 3, rank 1: 2 prompts x 1): what a
    # one-rank engine samples for its prompts at its n and seed
    for r, n in ((0, 3), (1, 1)):
        got = ranks[r]["uneven_n"]
        s = engine.sample(
            got["prompts"][::n],
            n,
            6,
            1.0,
            1.0,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            400 + 10 * r,
        )
        assert len(got["tokens"]) == (3 if r == 0 else 2)
        assert got["tokens"] == [
            s.response_ids[i, : int(s.lengths[i])].tolist() for i in range(len(s.lengths))
        ]


def test_a_rank_sampling_without_its_group_fails_instead_of_hanging(pair):
    _, alone = pair
    assert alone["error"] is not None and alone["seconds"] < 30, alone
    assert "rank 0 of a tensor-parallel vLLM group" in alone["error"]
    assert "every rank of a group must call sample equally often" in alone["error"]


RUN = [
    *GRPO_RUN,
    "rollout.vllm.tensor_parallel_size=2",
    "trainer.strategy=fsdp",
    "trainer.nproc_per_node=2",
    "trainer.threads=1",
    "task.n_eval=1",  # rank 1 evaluates nothing, and samples beside rank 0 all the same
    "trainer.total_steps=3",
    "trainer.eval_every=3",
]


def test_fsdp2_with_a_tensor_parallel_engine_trains_and_resumes_exactly(base, tmp_path):
    run = [*RUN, f"model.path={base[0]}"]
    full = train(tmp_path, *run, "run_name=full")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = train(tmp_path, *run, "run_name=killed", env={"VAPO_FAULT": "rollout@2"})
    assert killed.returncode != 0
    assert max(last_metrics(tmp_path / "runs" / "killed")) == 1
    resumed = train(tmp_path, "resume=runs/killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (last_metrics(tmp_path / "runs" / name) for name in ("full", "killed"))
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for step in a:
        assert json.dumps(a[step], sort_keys=True) == json.dumps(b[step], sort_keys=True), step
    assert "eval/avg_at_2" in a[0] and "eval/avg_at_2" in a[3]  # one problem, two samples
    assert a[3]["diag/sampler/logprob_gap_max"] < 1e-3
    assert not math.isnan(a[3]["actor/kl_loss"])
