"""No rank is left alone in a collective: a tensor-parallel pair whose second rank has no held-out
sample still samples with its partner, and one whose ranks ask for different numbers of samples
runs one batch (on vLLM's CPU stand-in); a reward model's samples are shared among a rank count
that does not divide them."""

import json
import sys
from pathlib import Path

import pytest

from tests.distributed.conftest import torchrun

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "rollout"))


def _model(tmp_path: Path) -> Path:
    from tests.rollout.conftest import save_tiny_model, vllm_config

    model = tmp_path / "model"
    save_tiny_model(vllm_config(), model)
    return model


@pytest.mark.parametrize("k", [1, 3])
def test_a_tensor_parallel_pair_evaluates_one_problem_together(tmp_path, k):
    # one held-out problem on 2 ranks. k = 1: rank 1's share is empty, and it still samples (an
    # empty list) beside rank 0, as the engine's group needs; before, it skipped the call and rank
    # 0 waited for it until EngineGroupError. k = 3: the 3 (problem, sample) pairs split 2 + 1,
    # so the pair's ranks ask for n = 2 and n = 1 in one engine group, whose batches must still
    # be alike (the stand-in compares them)
    sets = ["rollout.vllm.tensor_parallel_size=2", "task.n_eval=1", f"rollout.eval_samples={k}"]
    out = tmp_path / "run"
    torchrun(
        2,
        HERE / "rank_vllm_train.py",
        "grpo",
        str(_model(tmp_path)),
        str(out),
        *[f"--set={s}" for s in sets],
        timeout=600,
    )
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    key = f"eval/avg_at_{k}"
    evals = [m for m in ranks[0]["metrics"] if key in m]
    assert [m["step"] for m in evals] == [2]
    # both ranks get the whole result: one problem, k samples
    assert ranks[0]["metrics"][-1][key] == ranks[1]["metrics"][-1][key]
    assert ranks[0]["metrics"][-1][key] in [i / k for i in range(k + 1)]


def test_a_reward_model_of_16_samples_is_built_on_3_ranks(tmp_path):
    # 16 samples a round over 3 ranks: 6, 6 and 4 (each rank samples 6, the batch is cut to 16)
    sets = [
        "critic.rm_batch=16",
        "critic.rm_steps=2",
        "critic.pretrain.steps=1",
        "rollout.responses_per_step=12",
        "trainer.mini_batch_size=6",
        "rollout.group_size=4",
        "trainer.total_steps=1",
        "trainer.eval_every=1",
        "trainer.save_every=1",
    ]
    out = tmp_path / "run"
    torchrun(
        3,
        HERE / "rank_vllm_train.py",
        "vapo",
        str(_model(tmp_path)),
        str(out),
        *[f"--set={s}" for s in sets],
        timeout=900,
    )
    meta = json.loads(next((out / ".vapo_cache" / "reward_model").glob("*/meta.json")).read_text())
    assert len(meta["loss"]) == 2
    metrics = json.loads((out / "rank0.json").read_text())["metrics"]
    assert [m["step"] for m in metrics] == [1] and "critic/value_loss" in metrics[0]
