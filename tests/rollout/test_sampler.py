"""The built-in sampler and its decoders, against full forward passes of the same model."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vapo_lab.rollout.decoder import FastDecoder, HFDecoder, supports_fast_path
from vapo_lab.rollout.sampler import sample, top_p_filter

VOCAB = 40


def _qwen(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("make", [_qwen, _llama])
@pytest.mark.parametrize("decoder", [FastDecoder, HFDecoder])
def test_decoders_match_a_full_forward_pass(make, decoder):
    model = make()
    torch.manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :2] = False  # left padding of different widths
    mask[2, :5] = False
    ids[~mask] = 0
    new = torch.randint(3, VOCAB, (3, 4))
    with torch.no_grad():
        d = decoder(model, 3, 16)
        outs = [d.prefill(ids, mask)] + [d.step(new[:, j]) for j in range(4)]
        for b in range(3):
            seq = torch.cat([ids[b][mask[b]], new[b]])[None]
            ref = model(input_ids=seq).logits[0]
            p = int(mask[b].sum())
            for j, o in enumerate(outs):
                torch.testing.assert_close(o[b], ref[p - 1 + j], atol=1e-5, rtol=1e-5)


def test_fast_path_only_for_supported_models():
    assert supports_fast_path(_qwen()) and supports_fast_path(_llama())
    m = _qwen()
    m.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert not supports_fast_path(m)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.8
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


def _run(model, fast, seed=3, **kw):
    g = torch.Generator().manual_seed(seed)
    args = dict(n=3, max_new_tokens=12, eos_id=[1, 2], pad_id=0, generator=g, fast=fast)
    args.update(kw)
    return sample(model, [[5, 6, 7], [8], [9, 10, 11, 12, 13]], **args)


def test_sampler_is_deterministic_and_engines_agree():
    model = _qwen()
    a, b, c = _run(model, True), _run(model, True), _run(model, False)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert torch.equal(a.response_ids, c.response_ids)
    torch.testing.assert_close(a.logprobs, c.logprobs, atol=1e-5, rtol=0)
    assert not torch.equal(a.response_ids, _run(model, True, seed=4).response_ids)


def test_samples_layout_masks_and_logprobs():
    model = _qwen()
    s = _run(model, True, top_p=0.9, temperature=0.8)
    assert s.response_ids.shape[0] == 9 and s.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for b in range(9):
        n = int(s.lengths[b])
        assert s.response_mask[b].sum() == n and s.response_mask[b, :n].all()
        assert (s.response_ids[b, n:] == 0).all() and (s.logprobs[b, n:] == 0).all()
        # finished rows end with an eos; truncated rows ran to max_new_tokens
        if s.finished[b]:
            assert int(s.response_ids[b, n - 1]) in (1, 2)
            assert not any(int(t) in (1, 2) for t in s.response_ids[b, : n - 1])
        else:
            assert n == 12
        # log-probs are those of the temperature-scaled distribution (before top-p)
        prompt = s.prompt_ids[b][s.prompt_mask[b]]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, s.response_ids[b, :n]])[None]).logits[0]
        ref = (logits / 0.8).log_softmax(-1)[len(prompt) - 1 : len(prompt) - 1 + n]
        ref = ref.gather(-1, s.response_ids[b, :n, None]).squeeze(-1)
        torch.testing.assert_close(s.logprobs[b, :n], ref, atol=1e-5, rtol=0)


def test_greedy_is_argmax_and_chunking_does_not_change_it():
    model = _qwen()
    g = _run(model, True, temperature=0.0)
    assert torch.equal(g.response_ids[0], g.response_ids[1])  # greedy: every sample the same
    # greedy decoding of each prompt alone, by full forward passes
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    for i, p in enumerate(prompts):
        seq = list(p)
        with torch.no_grad():
            for _ in range(int(g.lengths[3 * i])):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        assert seq[len(p) :] == g.response_ids[3 * i, : int(g.lengths[3 * i])].tolist()
    chunked = _run(model, True, temperature=0.0, max_batch=3)  # one prompt (3 samples) per chunk
    assert torch.equal(chunked.lengths, g.lengths)
    width = g.response_ids.shape[1]
    assert torch.equal(chunked.response_ids[:, :width], g.response_ids)


def test_negative_temperature_rejected():
    with pytest.raises(ValueError, match="temperature"):
        _run(_qwen(), True, temperature=-1.0)


def test_top_p_draws_follow_the_filtered_distribution():
    from vapo_lab.rollout.sampler import _sample_top_p

    # one row, 6 tokens: probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04 (in shuffled order)
    probs = torch.tensor([0.1, 0.4, 0.04, 0.25, 0.06, 0.15])
    logits = probs.log().expand(20000, -1).contiguous()
    g = torch.Generator().manual_seed(0)
    tokens = _sample_top_p(logits, 0.7, g)
    # nucleus at 0.7: 0.4 + 0.25 < 0.7, so 0.15 joins; renormalised by 0.8
    freq = torch.bincount(tokens, minlength=6).float() / len(tokens)
    expected = torch.tensor([0.0, 0.5, 0.0, 0.3125, 0.0, 0.1875])
    assert torch.allclose(freq, expected, atol=0.015), freq
    assert torch.equal(
        _sample_top_p(logits[:50], 0.7, torch.Generator().manual_seed(3)),
        _sample_top_p(logits[:50], 0.7, torch.Generator().manual_seed(3)),
    )


def test_inverse_cdf_draws_match_the_weights_and_never_pick_a_zero():
    from vapo_lab.rollout.sampler import inverse_cdf_draw

    weights = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0]]).expand(40000, -1)
    draws = inverse_cdf_draw(weights, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=6).float() / len(draws)
    assert torch.allclose(freq, torch.tensor([0.0, 0.5, 0.0, 0.25, 0.25, 0.0]), atol=0.01), freq
    one_hot = torch.zeros(5, 6)
    one_hot[torch.arange(5), torch.tensor([0, 5, 2, 3, 5])] = 1.0  # first and last index too
    assert inverse_cdf_draw(one_hot, torch.Generator().manual_seed(1)).tolist() == [0, 5, 2, 3, 5]


def test_top_p_draws_stay_in_the_sorted_nucleus_and_match_it_when_it_is_wide():
    from vapo_lab.rollout.sampler import _sample_top_p

    # near-uniform rows (as from a random-init model): the nucleus holds most of the vocabulary
    torch.manual_seed(0)
    logits = (torch.randn(4, 40) * 0.3).repeat_interleave(5000, dim=0)
    tokens = _sample_top_p(logits, 0.7, torch.Generator().manual_seed(1))
    kept = torch.isfinite(top_p_filter(logits[::5000], 0.7))  # the reference: a full sort
    for row in range(4):
        drawn = tokens[row * 5000 : (row + 1) * 5000]
        assert kept[row, drawn].all()
        expected = top_p_filter(logits[row * 5000], 0.7).softmax(-1)
        freq = torch.bincount(drawn, minlength=40).float() / len(drawn)
        assert (freq - expected).abs().max() < 0.02, (row, freq, expected)


def test_top_p_outside_zero_one_rejected():
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            _run(_qwen(), True, top_p=bad)


def test_the_fast_decoder_keeps_every_projection_bias():
    """Llama with mlp_bias: the fused gate/up projection carries the biases too (logits as a full
    pass)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        mlp_bias=True,
        attention_bias=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases start at 0: give them values that matter
            p.add_(0.1 * torch.randn_like(p))
        ids = torch.randint(3, VOCAB, (2, 5))
        d = FastDecoder(model, 2, 8)
        got = d.prefill(ids, torch.ones_like(ids, dtype=torch.bool))
        torch.testing.assert_close(got, model(input_ids=ids).logits[:, -1], atol=1e-5, rtol=1e-5)


def test_no_prompts_give_no_samples_and_draw_nothing():
    # a rank without prompts still calls the sampler (its tensor-parallel partners sample): it
    # gets 0 rows, in the layout's dtypes, and its generator is left where it was
    model = _qwen()
    g = torch.Generator().manual_seed(3)
    s = sample(model, [], n=4, max_new_tokens=5, eos_id=2, pad_id=0, generator=g)
    assert s.response_ids.shape == (0, 0) and s.prompt_ids.dtype == torch.long
    assert s.lengths.tolist() == [] and s.truncated.tolist() == [] and s.logprobs.numel() == 0
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(3).get_state())
