"""Diagnostics: value bias by token position and the length profile, against hand-computed
values."""

import pytest
import torch

from vapo_lab.trainer.diagnostics import (
    bucket_labels,
    bucket_of,
    length_profile,
    value_bias_by_position,
)


def test_bucket_labels_and_edges():
    assert bucket_labels((0, 8, 16)) == ["000_007", "008_015", "016_up"]
    x = torch.tensor([0, 7, 8, 15, 16, 1000])
    assert bucket_of(x, (0, 8, 16)).tolist() == [0, 0, 1, 1, 2, 2]


def test_value_bias_by_position_by_hand():
    # two responses, edges (0, 2): positions 0-1 in "000_001", 2+ in "002_up"
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0], [0.0, 0.2, 0.4, 0.6]])
    returns = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # the 9.0 is padding and must not count
    got = value_bias_by_position(values, returns, mask, edges=(0, 2))
    # positions 0-1: errors -0.5, -0.5, 0.0, 0.2 -> -0.2; positions 2+: -0.5, 0.4, 0.6 -> 0.5/3
    assert got["000_001"] == pytest.approx(-0.2)
    assert got["002_up"] == pytest.approx(0.5 / 3)
    assert got["all"] == pytest.approx((-0.5 - 0.5 - 0.5 + 0.0 + 0.2 + 0.4 + 0.6) / 7)


def test_value_bias_empty_mask_and_missing_bucket():
    v = torch.zeros(1, 3)
    assert value_bias_by_position(v, v, torch.zeros(1, 3)) == {}
    got = value_bias_by_position(v, v, torch.ones(1, 3))
    assert set(got) == {"000_007", "all"}  # no token reaches position 8


def test_length_profile_by_hand():
    lengths = torch.tensor([3, 5, 9, 200])
    correct = torch.tensor([True, False, True, False])
    got = length_profile(lengths, correct, edges=(0, 8, 16))
    assert got == {
        "count_000_007": 2.0,
        "acc_000_007": 0.5,
        "count_008_015": 1.0,
        "acc_008_015": 1.0,
        "count_016_up": 1.0,
        "acc_016_up": 0.0,
        "correct_mean": 6.0,
        "wrong_mean": 102.5,
    }
    assert "correct_mean" not in length_profile(lengths, torch.zeros(4, dtype=torch.bool))


@pytest.mark.parametrize("decoupled", [True, False])
def test_monte_carlo_returns_are_the_final_score_at_gamma_one(decoupled):
    """With γ = 1 and the reward at the last token, G_t is the response's score at every token,
    whichever λ the critic's targets use."""
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed
    from vapo_lab.trainer.advantages import compute_advantages
    from vapo_lab.trainer.collect import Batch
    from vapo_lab.trainer.forward import Rows

    drop = [] if decoupled else ["decoupled_gae=off"]
    cfg = typed(compose_config(overrides=drop, check=False).cfg)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    rows = Rows(
        torch.zeros(2, 1, dtype=torch.long),
        torch.ones(2, 1),
        torch.zeros(2, 4, dtype=torch.long),
        mask,
    )
    batch = Batch(
        rows=rows,
        problems=[None, None],
        scores=torch.tensor([1.0, 0.0]),
        correct=torch.tensor([True, False]),
        lengths=mask.sum(-1),
        truncated=torch.zeros(2, dtype=torch.bool),
        old_logprobs=torch.zeros(2, 4),
        values=torch.tensor([[0.3, 0.6, 0.9, 0.0], [0.1, 0.2, 0.0, 0.0]]),
    )
    compute_advantages(cfg.algo, cfg.gae, cfg.kl, cfg.rollout.n_samples, batch)
    assert batch.mc_returns.tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_advantage_gap_by_hand():
    from vapo_lab.trainer.diagnostics import advantage_gap_from_sums, advantage_gap_sums

    # three responses; only those of >= 3 tokens count (min_length=3); edges (0, 2)
    adv = torch.tensor(
        [
            [1.0, 2.0, 3.0, 0.0],  # correct, length 3
            [-1.0, -1.0, -4.0, -2.0],  # wrong, length 4
            [50.0, 50.0, 0.0, 0.0],
        ]
    )  # correct but length 2: too short, ignored
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    correct = torch.tensor([True, False, True])
    lengths = torch.tensor([3, 4, 2])
    sums = advantage_gap_sums(adv, mask, correct, lengths, min_length=3, edges=(0, 2))
    got = advantage_gap_from_sums(sums, edges=(0, 2))
    # positions 0-1: correct mean 1.5, wrong mean -1 -> 2.5; positions 2+: correct 3, wrong -3 -> 6
    assert got == {"000_001": pytest.approx(2.5), "002_up": pytest.approx(6.0)}
    # sums add over ranks: two copies of the batch give the same means
    assert advantage_gap_from_sums(sums + sums, edges=(0, 2)) == got
    # no wrong long response: no gap to report
    assert (
        advantage_gap_from_sums(
            advantage_gap_sums(
                adv, mask, torch.ones(3, dtype=torch.bool), lengths, min_length=3, edges=(0, 2)
            ),
            edges=(0, 2),
        )
        == {}
    )
