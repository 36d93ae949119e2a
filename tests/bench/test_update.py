"""The update benchmark: its real-token share by hand, its padded reference path, (slow) a run."""

import pytest
import torch

from vapo_lab.bench.update import (
    format_update_benchmark,
    padded_path,
    real_token_share,
    run_update_benchmark,
)
from vapo_lab.models import packed as P
from vapo_lab.trainer import forward as F


def _rows():
    # prompts of 2 and 3 tokens (left-padded to 3), responses of 1, 4 and 2 (right-padded to 4)
    pm = torch.tensor([[False, True, True], [True, True, True], [False, True, True]])
    rm = torch.arange(4)[None] < torch.tensor([1, 4, 2])[:, None]
    return F.Rows(torch.ones(3, 3, dtype=torch.long), pm, torch.ones(3, 4, dtype=torch.long), rm)


def test_real_token_share_counts_valid_tokens_over_the_trimmed_layout():
    rows = _rows()
    # one micro-batch of all rows: (2+3+2) + (1+4+2) = 14 valid of 3 x (3+4) = 21 positions
    assert real_token_share(rows, [torch.arange(3)]) == pytest.approx(14 / 21)
    # rows 0 and 2 alone trim to prompts of 2 and responses of 2: 4 + 3 valid of 2 x 4 positions;
    # row 1 alone is all valid (7 of 7)
    assert real_token_share(rows, [torch.tensor([0, 2]), torch.tensor([1])]) == pytest.approx(
        (7 + 7) / (8 + 7)
    )


def test_the_padded_path_switches_the_packed_forward_off_and_back():
    from transformers import Qwen2Config, Qwen2Model

    decoder = Qwen2Model(
        Qwen2Config(
            vocab_size=10,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    assert P.shares_prompts(decoder)
    with padded_path():
        assert not P.shares_prompts(decoder) and F._groups(decoder, _rows()) is None
    assert P.shares_prompts(decoder)


@pytest.mark.slow
def test_one_repeat_on_a_default_step_agrees_with_the_padded_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_update_benchmark(repeats=1, threads=1)
    assert result["rows"] == 64 and result["micro_batches"] == 8
    assert 0.3 < result["share_padded"] < 0.95
    diff, size = result["max_abs_diff"], result["max_abs"]
    for key in ("logprobs", "values", "grads"):
        assert diff[key] <= 1e-5 * max(1.0, size[key]), (key, diff, size)
    text = format_update_benchmark(result)
    assert "real-token share" in text and "actor" in text and "critic" in text
