"""Mixed precision: float32 master weights computing in bf16 train like float32 at an RL learning
rate, where pure bf16 barely moves; heads and backbones agree on dtype and device."""

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vapo_lab.models.precision import MASTER, autocast, compute_dtype, set_compute
from vapo_lab.models.value import ValueModel
from vapo_lab.trainer.forward import Rows, policy_forward


def _model():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg)


def _rows():
    g = torch.Generator().manual_seed(1)
    prompts, responses = (
        torch.randint(3, 64, (8, 6), generator=g),
        torch.randint(3, 64, (8, 10), generator=g),
    )
    ones = lambda x: torch.ones_like(x, dtype=torch.bool)  # noqa: E731
    return Rows(prompts, ones(prompts), responses, ones(responses))


def _update(model, lr):
    """One AdamW step on the mean response log-likelihood; returns each parameter's change."""
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    logprobs, _ = policy_forward(model.train(), _rows())
    (-logprobs.mean()).backward()
    opt.step()
    return torch.cat(
        [(p.detach().float() - b.float()).flatten() for p, b in zip(model.parameters(), before)]
    )


def test_bf16_compute_updates_like_float32():
    fp32 = _update(_model(), 1e-3)
    mixed_model = set_compute(_model(), "bfloat16")
    mixed = _update(mixed_model, 1e-3)
    assert all(p.dtype == MASTER for p in mixed_model.parameters())  # master weights stay float32
    # Adam's first step is about lr·sign(g): bf16 gradients flip the sign of only near-zero entries
    cosine = torch.nn.functional.cosine_similarity(fp32, mixed, dim=0)
    assert cosine > 0.98, float(cosine)
    assert (
        mixed - fp32
    ).abs().max() <= 2e-3 + 1e-9  # at most one step's width apart, entry by entry


def test_parameters_move_at_an_rl_learning_rate_with_master_weights_and_not_in_pure_bf16():
    moved = (_update(set_compute(_model(), "bfloat16"), 1e-6) != 0).float().mean()
    pure = (_update(_model().to(torch.bfloat16), 1e-6) != 0).float().mean()
    assert moved > 0.99, float(moved)
    # the step rounds away in bf16 storage: why the masters are float32
    assert pure < 0.2, float(pure)


def test_autocast_computes_in_the_tagged_dtype_only():
    model, rows = set_compute(_model(), "bfloat16"), _rows()
    seen = []
    hook = model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    policy_forward(model, rows)
    set_compute(model, "float32")
    policy_forward(model, rows)
    hook.remove()
    assert seen == [torch.bfloat16, torch.float32]
    assert compute_dtype("float32") is None and compute_dtype("float16") == torch.float16
    with autocast(torch.nn.Linear(2, 2)):  # an untagged model: no autocast
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("make", [ValueModel.from_causal_lm, ValueModel.random_like])
def test_a_value_model_of_a_bf16_policy_runs(make):
    """A new head beside a bf16 backbone is made in the backbone's dtype (it was float32: 'mat1 and
    mat2 must have the same dtype' on the first forward)."""
    critic = make(_model().to(torch.bfloat16))
    assert critic.head.weight.dtype == torch.bfloat16
    rows = _rows()
    ids, mask = rows.sequence()
    assert critic(ids, mask.long()).shape == ids.shape


class _Decoder(torch.nn.Module):
    """A decoder that accepts inputs only on its own device (HF's mask code cannot run on meta)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)

    def forward(self, input_ids, attention_mask, position_ids):
        device = self.embed.weight.device
        assert input_ids.device == attention_mask.device == position_ids.device == device
        return SimpleNamespace(last_hidden_state=self.embed(input_ids))


class _LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model, self.lm_head = _Decoder(), torch.nn.Linear(8, 64)


def test_the_forward_passes_move_rows_to_the_models_device():
    """Rows made on the CPU (vLLM returns Python lists) meet a model on another device: here
    meta."""
    from vapo_lab.trainer.forward import value_forward

    logprobs, _ = policy_forward(_LM().to("meta"), _rows())
    assert logprobs.device.type == "meta"
    assert value_forward(ValueModel(_Decoder(), 8).to("meta"), _rows()).device.type == "meta"
    with pytest.raises(AssertionError):  # the check itself: CPU rows never reach a meta decoder
        _Decoder().to("meta")(*(_rows().sequence()), torch.zeros(1))
