"""Token-budget micro-batches: how rows are split, and that the split leaves the update
unchanged."""

import copy

import pytest
import torch

from tests.distributed.rank_update import config, global_batch, models
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import Rows, batched_logprobs, token_micro_batches
from vapo_lab.trainer.update import ActorUpdate, CriticUpdate, Descent


def _rows(lengths):
    """Rows with the given (prompt, response) valid lengths, prompts left- and responses
    right-padded."""
    p, t = max(a for a, _ in lengths), max(b for _, b in lengths)
    pm = torch.tensor([[j >= p - a for j in range(p)] for a, _ in lengths])
    rm = torch.tensor([[j < b for j in range(t)] for _, b in lengths])
    return Rows(pm.long(), pm, rm.long(), rm)


def _cost(rows, idx):
    """The tokens of the layout a pass runs ``idx`` in: rows x (longest prompt + longest
    response)."""
    return len(idx) * int(
        rows.prompt_mask[idx].sum(-1).max() + rows.response_mask[idx].sum(-1).max()
    )


def test_rows_that_fit_are_one_micro_batch_in_their_order():
    rows = _rows([(2, 5), (3, 1), (1, 2)])  # 3 rows x (3 + 5) = 24 tokens
    index = torch.tensor([2, 0, 1])
    parts = token_micro_batches(index, rows, 24)
    assert len(parts) == 1 and parts[0].tolist() == [2, 0, 1]


def test_rows_are_sorted_by_tokens_and_filled_to_the_budget():
    # tokens per row: 7, 4, 3, 9, 2 -> sorted (stable): rows 4 (2), 2 (3), 1 (4), 0 (7), 3 (9)
    rows = _rows([(2, 5), (3, 1), (1, 2), (4, 5), (1, 1)])
    # budget 12: [4, 2] costs 2 x (1 + 2) = 6; adding row 1 (3, 1): 3 x (3 + 2) = 15 > 12, so it
    # starts the next; [1] 4, + row 0 (2, 5): 2 x (3 + 5) = 16 > 12; [0] 7, + row 3: 2 x 9 = 18;
    # [3] 9
    parts = token_micro_batches(torch.arange(5), rows, 12)
    assert [p.tolist() for p in parts] == [[4, 2], [1], [0], [3]]


def test_a_row_longer_than_the_budget_is_a_micro_batch_alone():
    rows = _rows([(4, 20), (1, 1), (1, 2)])
    parts = token_micro_batches(torch.arange(3), rows, 8)
    assert [p.tolist() for p in parts] == [[1, 2], [0]]


def test_in_order_filling_keeps_the_given_order():
    rows = _rows([(2, 5), (1, 1), (1, 1), (1, 1)])  # 7, 2, 2, 2 tokens
    parts = token_micro_batches(torch.tensor([3, 0, 1, 2]), rows, 8, by_length=False)
    # [3] 2, + row 0: 2 x 7 = 14 > 8; [0] 7, + row 1: 2 x (2 + 5) > 8; [1, 2] 4
    assert [p.tolist() for p in parts] == [[3], [0], [1, 2]]


@pytest.mark.parametrize("budget", [1, 17, 40, 100, 10_000])
def test_every_row_once_and_no_micro_batch_over_the_budget(budget):
    rows, _ = global_batch(32)
    index = torch.randperm(32, generator=torch.Generator().manual_seed(budget))
    parts = token_micro_batches(index, rows, budget)
    assert sorted(torch.cat(parts).tolist()) == list(range(32))
    assert all(_cost(rows, p) <= budget or len(p) == 1 for p in parts)


def test_batched_log_probs_are_the_same_whatever_the_split():
    torch.manual_seed(0)
    policy, _ = models()
    policy = policy.double()
    rows, _ = global_batch(16)
    one = batched_logprobs(policy, rows, [torch.arange(16)], 1.0)
    split = batched_logprobs(policy, rows, token_micro_batches(torch.arange(16), rows, 30), 1.0)
    assert one.dtype == torch.float64
    torch.testing.assert_close(
        split * rows.response_mask, one * rows.response_mask, rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("preset", ["vapo", "grpo"])
def test_the_update_is_the_same_with_many_micro_batches_as_with_one(preset):
    """A mini-batch split into token-budget micro-batches takes the optimiser step the unsplit
    mini-batch takes: every micro-batch's loss is divided by the mini-batch's denominator."""
    torch.set_default_dtype(torch.float64)
    try:
        results = []
        for budget in (10**9, 30):
            cfg = config(preset)
            cfg.trainer.max_tokens_per_micro_batch = budget
            policy, critic = models()
            rows, scores = global_batch(16)
            batch = Batch(
                rows=rows,
                problems=[None] * 16,
                scores=scores,
                correct=scores > 0,
                lengths=rows.response_mask.sum(-1),
                truncated=torch.zeros(16, dtype=torch.bool),
                old_logprobs=batched_logprobs(policy, rows, [torch.arange(16)], 1.0) - 0.05,
            )
            batch.advantages = torch.randn(
                rows.response_ids.shape, generator=torch.Generator().manual_seed(3)
            )
            batch.values = torch.zeros(rows.response_ids.shape)
            batch.returns = batch.advantages.clone()
            sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)  # noqa: E731
            descent = Descent(cfg.trainer, torch.Generator().manual_seed(1))
            if budget == 30:  # (a twin's mini-batches: drawing them advances the generator)
                twin = Descent(cfg.trainer, torch.Generator().manual_seed(1))
                assert min(len(twin.micro(mb, rows)) for mb, _ in twin.minibatches(16)) > 2
            temperature = cfg.rollout.temperature
            ActorUpdate(descent, cfg.loss, cfg.kl, temperature, policy, sgd(policy))(batch, 0)
            CriticUpdate(descent, cfg.critic, critic, sgd(critic))(batch, 0)
            results.append(
                copy.deepcopy([p.detach() for m in (policy, critic) for p in m.parameters()])
            )
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    finally:
        torch.set_default_dtype(torch.float32)
