"""The packed training forward (shared prompts or one per row) against Hugging Face's padded forward
over prompt ++ response: log-probs, entropy, values and gradients."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vapo_lab.algo import token_logprobs_and_entropy
from vapo_lab.models import packed as P
from vapo_lab.models.value import ValueModel
from vapo_lab.trainer import forward as F


def _model(**kw):
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **kw,
    )
    return Qwen2ForCausalLM(cfg).train()


def _rows(vocab=50, p=6, t=5):
    """7 rows over 3 distinct prompts of 6, 3 and 1 real tokens (left-padded), responses of 1-5
    tokens."""
    g = torch.Generator().manual_seed(1)
    prompts = []
    for n in (6, 3, 1):
        mask = torch.arange(p) >= p - n
        prompts.append((torch.where(mask, torch.randint(3, vocab, (p,), generator=g), 2), mask))
    which = [0, 1, 0, 2, 1, 0, 2]
    lengths = torch.tensor([5, 3, 1, 5, 4, 2, 3])
    rmask = torch.arange(t)[None] < lengths[:, None]
    rids = torch.where(rmask, torch.randint(3, vocab, (len(which), t), generator=g), 2)
    return F.Rows(
        torch.stack([prompts[w][0] for w in which]),
        torch.stack([prompts[w][1] for w in which]),
        rids,
        rmask,
    )


def _hf_hidden(decoder, rows):
    ids, mask = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return decoder(input_ids=ids, attention_mask=mask.long(), position_ids=pos).last_hidden_state[
        :, p - 1 : p - 1 + t
    ]


PATHS = {"shared prompts": 1, "one prompt per row": 100}  # MIN_ROWS_PER_PROMPT for each packed path


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("path", list(PATHS))
def test_packed_log_probs_entropy_values_and_gradients_equal_the_padded_forward(
    monkeypatch, path, dtype
):
    monkeypatch.setattr(P, "MIN_ROWS_PER_PROMPT", PATHS[path])
    model, rows = _model().to(dtype), _rows()
    mask = rows.response_mask
    assert P.shares_prompts(model.model)
    assert (len(F._groups(model.model, rows)[0]) == 3) == (path == "shared prompts")
    # float64: one prompt per row runs the padded forward's per-token ops in its order, so it agrees
    # to float64 rounding. Shared prompts sum their responses' gradients before a layer's backward,
    # not after, and HF's RMSNorm computes in float32 whatever the dtype: ~1e-7 relative there.
    if dtype == torch.float32:
        tol = dict(rtol=1e-4, atol=2e-6)
    else:
        tol = (
            dict(rtol=1e-10, atol=1e-12)
            if path == "one prompt per row"
            else dict(rtol=1e-6, atol=5e-7)
        )
    logits = model.lm_head(_hf_hidden(model.model, rows))
    ref, ref_entropy = token_logprobs_and_entropy(logits, rows.response_ids)
    (ref * mask).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got, entropy = F.policy_forward(model, rows, with_entropy=True)
    assert (
        got.dtype == dtype and bool((got[~mask] == 0).all()) and bool((entropy[~mask] == 0).all())
    )
    torch.testing.assert_close(got[mask], ref[mask], **tol)
    torch.testing.assert_close(entropy[mask], ref_entropy[mask], **tol)
    (got * mask).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], **tol, msg=n)

    critic = ValueModel.from_causal_lm(model).to(dtype)
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ids, m = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    hidden = critic.backbone(
        input_ids=ids, attention_mask=m.long(), position_ids=(m.long().cumsum(-1) - 1).clamp(min=0)
    )
    # ValueModel's, in dtype
    ref_values = critic.head(hidden.last_hidden_state).squeeze(-1)[:, p - 1 : p - 1 + t]
    (ref_values[mask] ** 2).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in critic.named_parameters()}
    critic.zero_grad()
    values = F.value_forward(critic, rows)
    torch.testing.assert_close(values[mask], ref_values[mask], **tol)
    (values[mask] ** 2).sum().backward()
    for n, p in critic.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], **tol, msg=n)


def test_the_packed_path_pays_for_valid_tokens_only(monkeypatch):
    """The token-wise ops see the valid tokens, not the padded layout: the first layer's MLP runs on
    the prompts' valid tokens, then on the responses' (a padded forward: 7 rows x 11 positions)."""
    model, rows = _model(), _rows()
    seen = []
    model.model.layers[0].mlp.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].shape[0])
    )
    response_tokens = int(rows.response_mask.sum())
    assert response_tokens == 5 + 3 + 1 + 5 + 4 + 2 + 3
    F.policy_forward(model, rows)  # 3 distinct prompts of 6, 3 and 1 tokens, computed once
    monkeypatch.setattr(P, "MIN_ROWS_PER_PROMPT", 100)
    F.policy_forward(model, rows)  # each row's own prompt
    assert seen == [6 + 3 + 1, response_tokens, 6 + 3 + 6 + 1 + 3 + 6 + 1, response_tokens]


def test_models_it_cannot_run_take_the_padded_forward(monkeypatch):
    model = _model(attention_dropout=0.1)
    assert not P.shares_prompts(model.model)
    monkeypatch.setattr(F, "packed_states", lambda *a: pytest.fail("packed path taken"))
    lp, ent = F.policy_forward(model.eval(), _rows(), with_entropy=True)
    assert lp.shape == ent.shape == (7, 5)


def test_prompts_are_shared_only_where_they_repeat():
    # 7 rows, 3 prompts: fewer than 2 rows per prompt? no: 7 >= 2 x 3
    model, rows = (
        _model(),
        _rows(),
    )
    uniq, inverse = F._groups(model.model, rows)
    assert len(uniq) == 3 and inverse.tolist() == [2, 1, 2, 0, 1, 2, 0]  # torch.unique sorts
    distinct = F.Rows(
        *(
            x[[0, 1, 3]]
            for x in (rows.prompt_ids, rows.prompt_mask, rows.response_ids, rows.response_mask)
        )
    )
    uniq, inverse = F._groups(model.model, distinct)  # 3 rows, 3 prompts: one per row, in row order
    assert inverse.tolist() == [0, 1, 2] and torch.equal(uniq[:, :6], distinct.prompt_ids)


def _mlp_calls(decoder):
    """Returns a list that grows by one whenever the first layer's MLP starts a forward pass (a
    pre-hook: a recompute may stop inside the MLP once it has every tensor the backward pass
    needs)."""
    calls = []
    decoder.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize("packed", [True, False], ids=["packed path", "HF forward"])
def test_checkpointing_gives_the_same_gradients_and_recomputes_the_layers(monkeypatch, packed):
    import copy

    if not packed:
        monkeypatch.setattr(P, "shares_prompts", lambda decoder: False)
    rows = _rows()
    mask = rows.response_mask
    plain = _model()
    checkpointed = copy.deepcopy(plain)
    P.enable_checkpointing(checkpointed)
    grads, recomputed = [], []
    for model in (plain, checkpointed):
        assert (F._groups(model.model, rows) is not None) == packed
        calls = _mlp_calls(model.model)
        logprobs, _ = F.policy_forward(model, rows)
        forward_calls = len(calls)
        (logprobs * mask).sum().backward()
        recomputed.append(len(calls) - forward_calls)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert recomputed[0] == 0 and recomputed[1] > 0  # checkpointing ran the layer again in backward
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("packed", [True, False], ids=["packed path", "HF forward"])
def test_a_checkpointed_critic_gets_the_same_gradients(monkeypatch, packed):
    if not packed:
        monkeypatch.setattr(P, "shares_prompts", lambda decoder: False)
    rows = _rows()
    plain = ValueModel.from_causal_lm(_model())
    torch.nn.init.normal_(plain.head.weight, std=0.1)
    checkpointed = ValueModel.from_causal_lm(_model())
    checkpointed.load_state_dict(plain.state_dict())
    P.enable_checkpointing(checkpointed.backbone)
    grads, recomputed = [], []
    for critic in (plain.train(), checkpointed.train()):
        calls = _mlp_calls(critic.backbone)
        values = F.value_forward(critic, rows)
        forward_calls = len(calls)
        (values * rows.response_mask).square().sum().backward()
        recomputed.append(len(calls) - forward_calls)
        grads.append({n: p.grad for n, p in critic.named_parameters()})
    assert recomputed[0] == 0 and recomputed[1] > 0
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-5, atol=1e-7, msg=n)


def test_checkpointing_is_off_outside_training_and_without_gradients():
    model = _model()
    P.enable_checkpointing(model)
    assert P.checkpointing(model.model)
    with torch.no_grad():
        assert not P.checkpointing(model.model)
    assert not P.checkpointing(model.eval().model)


def test_distinct_prompts_with_little_padding_take_the_padded_forward():
    """Nothing to skip: HF's single attention over prompt ++ response is the faster path there."""
    model = _model()
    g = torch.Generator().manual_seed(2)
    full = F.Rows(
        torch.randint(3, 50, (4, 6), generator=g),
        torch.ones(4, 6, dtype=torch.bool),
        torch.randint(3, 50, (4, 5), generator=g),
        torch.ones(4, 5, dtype=torch.bool),
    )
    assert F._groups(model.model, full) is None  # 4 distinct prompts, every position valid
    # 37 of 44 valid: 84%
    padded = F.Rows(
        full.prompt_ids,
        full.prompt_mask,
        full.response_ids,
        torch.arange(5)[None] < torch.tensor([5, 1, 2, 5])[:, None],
    )
    assert F._groups(model.model, padded) is not None
    repeated = F.Rows(
        *(
            x[[0, 0, 1, 1]]
            for x in (full.prompt_ids, full.prompt_mask, full.response_ids, full.response_mask)
        )
    )
    # repeated prompts are shared, padding or not
    assert len(F._groups(model.model, repeated)[0]) == 2
