"""The step's metrics on one process are exactly the statistics of its batch, computed by the maths
of ``vapo_lab.algo`` and torch (the reductions over ranks are identities there)."""

import torch

from vapo_lab.algo import explained_variance, masked_mean
from vapo_lab.distributed.world import single
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.diagnostics import value_bias_by_position
from vapo_lab.trainer.forward import Rows
from vapo_lab.trainer.metrics import StepTimes, critic_metrics, step_metrics


def _batch(b=12, t=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    rows = Rows(
        torch.ones(b, 3, dtype=torch.long),
        torch.ones(b, 3, dtype=torch.bool),
        torch.ones(b, t, dtype=torch.long),
        mask,
    )
    correct = torch.rand(b, generator=g) < 0.4
    batch = Batch(
        rows, list(range(b)), correct.float(), correct, lengths, lengths == t, torch.zeros(b, t)
    )
    batch.values = torch.randn(b, t, generator=g)
    batch.returns = correct.float()[:, None].expand(b, t).clone()
    batch.mc_returns = batch.returns.clone()
    batch.advantages = torch.randn(b, t, generator=g) * 3 + 0.5
    batch.lam_policy = 1 - 1 / (0.05 * lengths.float()).clamp(min=1)
    return batch


def test_one_process_metrics_are_the_batch_statistics_to_the_bit():
    batch = _batch()
    mask = batch.rows.response_mask
    m = step_metrics(batch, single(), 1e-6, StepTimes(0.0, 2.0, 2.5, 3.0, 4.0))
    assert m["adv/mean"] == float(masked_mean(batch.advantages, mask))
    assert m["adv/std"] == float(batch.advantages[mask].std())
    assert m["rollout/reward"] == float(batch.scores.mean())
    assert m["rollout/response_length_max"] == float(batch.lengths.max())
    assert m["gae/lam_policy_mean"] == float(batch.lam_policy.mean())
    assert m["perf/tokens_per_s"] == float(mask.sum()) / 2.0
    assert (m["time/rollout_s"], m["time/critic_s"], m["time/actor_s"], m["time/step_s"]) == (
        2.0,
        0.5,
        1.0,
        4.0,
    )
    bias = value_bias_by_position(batch.values, batch.mc_returns, mask)
    assert {
        k[len("diag/value_bias/") :]: v for k, v in m.items() if k.startswith("diag/value_bias/")
    } == bias
    c = critic_metrics(batch, single())
    assert c["critic/explained_variance"] == float(
        explained_variance(batch.values, batch.returns, mask)
    )
    assert c["critic/value_mean"] == float(masked_mean(batch.values, mask))


def test_explained_variance_is_nan_where_returns_do_not_vary():
    batch = _batch()
    batch.returns = torch.ones_like(batch.returns)
    assert torch.isnan(torch.tensor(critic_metrics(batch, single())["critic/explained_variance"]))
