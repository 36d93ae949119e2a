"""The shared-prompt training forward against Hugging Face's full forward over prompt ++ response."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vapo_lab.models.value import ValueModel
from vapo_lab.trainer import forward as F


def _model(**kw):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)
    return Qwen2ForCausalLM(cfg).train()


def _rows(vocab=50, p=6, t=5):
    """7 rows over 3 distinct prompts of 6, 3 and 1 real tokens (left-padded), responses of 1-5 tokens."""
    g = torch.Generator().manual_seed(1)
    prompts = []
    for n in (6, 3, 1):
        mask = torch.arange(p) >= p - n
        prompts.append((torch.where(mask, torch.randint(3, vocab, (p,), generator=g), 2), mask))
    which = [0, 1, 0, 2, 1, 0, 2]
    lengths = torch.tensor([5, 3, 1, 5, 4, 2, 3])
    rmask = torch.arange(t)[None] < lengths[:, None]
    rids = torch.where(rmask, torch.randint(3, vocab, (len(which), t), generator=g), 2)
    return F.Rows(torch.stack([prompts[w][0] for w in which]), torch.stack([prompts[w][1] for w in which]), rids, rmask)


def _hf_hidden(decoder, rows):
    ids, mask = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return decoder(input_ids=ids, attention_mask=mask.long(), position_ids=pos).last_hidden_state[:, p - 1:p - 1 + t]


def test_log_probs_values_and_gradients_equal_the_full_forward(monkeypatch):
    monkeypatch.setattr(F, "MIN_ROWS_PER_PROMPT", 1)  # take the shared path for 7 rows of 3 prompts
    model, rows = _model(), _rows()
    mask = rows.response_mask
    assert F.shares_prompts(model.model)
    ref = F.token_logprobs(model.lm_head(_hf_hidden(model.model, rows)).float(), rows.response_ids)
    (ref * mask).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got, _ = F.policy_forward(model, rows)
    torch.testing.assert_close(got * mask, ref * mask, rtol=0, atol=1e-5)
    (got * mask).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], rtol=1e-4, atol=1e-6, msg=n)

    critic = ValueModel.from_causal_lm(model)
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ids, m = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    torch.testing.assert_close(F.value_forward(critic, rows) * mask, critic(ids, m.long())[:, p - 1:p - 1 + t] * mask,
                               rtol=0, atol=1e-5)


def test_models_it_cannot_run_take_the_full_forward(monkeypatch):
    model = _model(attention_dropout=0.1)
    assert not F.shares_prompts(model.model)
    monkeypatch.setattr(F, "response_states", lambda *a: pytest.fail("shared-prompt path taken"))
    lp, ent = F.policy_forward(model.eval(), _rows(), with_entropy=True)
    assert lp.shape == ent.shape == (7, 5)


def test_the_shared_path_runs_only_where_prompts_repeat(monkeypatch):
    model, rows = _model(), _rows()  # 7 rows, 3 prompts: fewer than 4 rows per prompt
    assert F._shared(model.model, rows) is None
    four = F.Rows(*(x[[0, 0, 2, 5, 0, 2, 5, 0]] for x in (rows.prompt_ids, rows.prompt_mask, rows.response_ids,
                                                            rows.response_mask)))
    uniq, inverse = F._shared(model.model, four)  # 8 rows of one prompt
    assert len(uniq) == 1 and inverse.tolist() == [0] * 8


def _mlp_calls(decoder):
    """Returns a list that grows by one whenever the first layer's MLP starts a forward pass (a pre-hook:
    a recompute may stop inside the MLP once it has every tensor the backward pass needs)."""
    calls = []
    decoder.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt path", "HF forward"])
def test_checkpointing_gives_the_same_gradients_and_recomputes_the_layers(monkeypatch, shared):
    import copy

    monkeypatch.setattr(F, "MIN_ROWS_PER_PROMPT", 1 if shared else 100)
    rows = _rows()
    mask = rows.response_mask
    plain = _model()
    checkpointed = copy.deepcopy(plain)
    F.enable_checkpointing(checkpointed)
    grads, recomputed = [], []
    for model in (plain, checkpointed):
        assert (F._shared(model.model, rows) is not None) == shared
        calls = _mlp_calls(model.model)
        logprobs, _ = F.policy_forward(model, rows)
        forward_calls = len(calls)
        (logprobs * mask).sum().backward()
        recomputed.append(len(calls) - forward_calls)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert recomputed[0] == 0 and recomputed[1] > 0  # checkpointing ran the layer again in backward
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt path", "HF forward"])
def test_a_checkpointed_critic_gets_the_same_gradients(monkeypatch, shared):
    monkeypatch.setattr(F, "MIN_ROWS_PER_PROMPT", 1 if shared else 100)
    rows = _rows()
    plain = ValueModel.from_causal_lm(_model())
    torch.nn.init.normal_(plain.head.weight, std=0.1)
    checkpointed = ValueModel.from_causal_lm(_model())
    checkpointed.load_state_dict(plain.state_dict())
    F.enable_checkpointing(checkpointed.backbone)
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
    F.enable_checkpointing(model)
    assert F.checkpointing(model.model)
    with torch.no_grad():
        assert not F.checkpointing(model.model)
    assert not F.checkpointing(model.eval().model)
