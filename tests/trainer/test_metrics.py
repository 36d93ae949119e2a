"""The step's metrics on one process are exactly the statistics of its batch, computed by the maths
of ``vapo_lab.algo`` and torch (the reductions over ranks are identities there)."""

import torch

from vapo_lab.algo import explained_variance, masked_mean
from vapo_lab.distributed.world import single
from vapo_lab.models.shapes import Shape
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.diagnostics import value_bias_by_position
from vapo_lab.trainer.forward import Rows
from vapo_lab.trainer.metrics import StageRates, StepTimes, critic_metrics, step_metrics


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
    m = step_metrics(batch, single(), 1e-6, StepTimes(0.0, 2.0, 2.2, 2.5, 3.0, 4.0, 4.0))
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


def test_stage_rates_and_mfu_by_hand():
    batch = _batch()
    tokens = int(batch.rows.response_mask.sum())  # generated
    sequences = tokens + 12 * 3  # + 3 prompt tokens a row
    # rollout 2 s, passes 0.5 s, critic 1 s, actor 2 s, push 0.25 s
    times = StepTimes(0.0, 2.0, 2.5, 2.5, 3.5, 5.5, 5.75)
    shape = Shape(8, 2, 2, 1, 4, 16, 10, True, 64)
    rates = StageRates(shape, actor_params=1000, critic_params=900, ppo_epochs=2, peak_flops=1e6)
    m = step_metrics(batch, single(), 1e-6, times, rates)
    assert m["time/outputs_s"] == 0.5 and m["time/push_s"] == 0.25 and m["time/step_s"] == 5.75
    assert m["time/actor_s"] == 2.0  # the push is no longer in the actor's time
    assert m["perf/gen_tokens_per_s_per_device"] == tokens / 2.0
    assert m["perf/pass_tokens_per_s_per_device"] == sequences / 0.5
    # two models trained, two epochs, 3 s of updates
    assert m["perf/train_tokens_per_s_per_device"] == 2 * 2 * sequences / 3.0
    # model FLOPs: 2 epochs x sequence tokens x (6 P + 3 attention) per model, attention per token
    # 2·L·s·h at the mean sequence s = sequences / 12 rows
    s = sequences / 12
    per_token = (6 * 1000 + 3 * 2 * 2 * s * 8) + (6 * 900 + 3 * 2 * 2 * s * 8)
    assert abs(m["perf/mfu"] - 2 * sequences * per_token / (3.0 * 1e6)) < 1e-12
    # no peak (CPU, an unknown GPU): no MFU, the rates still
    cpu = step_metrics(batch, single(), 1e-6, times, StageRates(shape, 1000, 0, 2, None))
    assert "perf/mfu" not in cpu and cpu["perf/train_tokens_per_s_per_device"] == 2 * sequences / 3


def test_the_peak_table_matches_device_names_as_torch_reports_them():
    from vapo_lab.models.peaks import peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12  # before the SXM's "H100"
    assert peak_flops("NVIDIA H200", "float32") == 67e12
    assert peak_flops("NVIDIA GeForce RTX 3090", "bfloat16") is None
    assert peak_flops("NVIDIA A100-SXM4-80GB", "float64") is None


def test_the_samplers_gap_to_the_policy_by_hand():
    batch = _batch(b=2, t=3)
    batch.rows.response_mask = torch.tensor([[True, True, False], [True, False, False]])
    batch.old_logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    # the sampler's log-probs: gaps +0.1, -0.3 and 0 on the valid tokens; 9 where none is valid
    batch.sampler_logprobs = torch.tensor([[-1.1, -1.7, 9.0], [-0.5, 9.0, 9.0]])
    m = step_metrics(batch, single(), 1e-6, StepTimes(0.0, 2.0, 2.2, 2.5, 3.0, 4.0, 4.0))
    assert abs(m["diag/sampler/logprob_gap_mean"] - 0.4 / 3) < 1e-6
    assert abs(m["diag/sampler/logprob_gap_max"] - 0.3) < 1e-6
    # pi_policy / pi_sampler = exp(policy - sampler): e^0.1, e^-0.3, e^0
    assert abs(m["diag/sampler/ratio_max"] - 1.1051709) < 1e-6
    assert abs(m["diag/sampler/ratio_min"] - 0.7408182) < 1e-6
    ratios = [1.1051709, 0.7408182, 1.0]
    mean = sum(ratios) / 3
    sd = (sum((r - mean) ** 2 for r in ratios) / 2) ** 0.5
    assert abs(m["diag/sampler/ratio_std"] - sd) < 1e-6
    batch.sampler_logprobs = None  # the sampler's own log-probs were kept: no such metric
    m = step_metrics(batch, single(), 1e-6, StepTimes(0.0, 2.0, 2.2, 2.5, 3.0, 4.0, 4.0))
    assert not any(k.startswith("diag/sampler/") for k in m)
