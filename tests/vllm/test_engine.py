"""The vLLM backend (``VllmEngine``) on the real engine: build on vLLM's CPU platform, sample, and
push weights through vLLM's in-place reload, proven by what the engine then samples.

Proofs of a push: all-zero weights (the embeddings kept) make every logit 0, so every sampled
token's log-prob is -ln V (V the vocabulary); pushing the policy back gives the same tokens for the
same seed as before; the sampled tokens' log-probs equal the policy's own, recomputed by an HF
forward pass in float32.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from tests.vllm.conftest import prompts
from vapo_lab.rollout.vllm_backend import VllmEngine, WeightPushError, weight_buckets

pytestmark = pytest.mark.vllm

BUCKET_MB = 1  # the tiny model is 4.4 MB in float32: a push streams several buckets


@pytest.fixture(scope="module")
def engine(tiny):
    """(engine, the error of sampling before any push): built from dummy weights, with the
    trainer's defaults for sleep mode."""
    path, _, tokenizer = tiny
    built = VllmEngine(
        path,
        dtype="float32",
        seed=0,
        max_model_len=48,
        enforce_eager=True,
        enable_sleep_mode=True,
        dummy_weights=True,
        weight_bucket_mb=BUCKET_MB,
    )
    with pytest.raises(WeightPushError) as before_push:
        _sample(built, tokenizer, seed=1)
    return built, str(before_push.value)


def _sample(engine, tokenizer, seed: int, n: int = 4, max_new_tokens: int = 16, texts=None):
    return engine.sample(
        prompts(tokenizer, *([texts] if texts else [])),
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        seed=seed,
    )


@torch.no_grad()
def _policy_logprobs(samples, model) -> torch.Tensor:
    """The sampled tokens' log-probs under ``model`` (one HF forward a row, float32), flattened."""
    out = []
    for r in range(samples.response_ids.shape[0]):
        prompt = samples.prompt_ids[r][samples.prompt_mask[r]]
        response = samples.response_ids[r, : int(samples.lengths[r])]
        logits = model(torch.cat([prompt, response])[None]).logits[0, len(prompt) - 1 : -1]
        out.append(logits.float().log_softmax(-1).gather(-1, response[:, None]).squeeze(-1))
    return torch.cat(out)


def _engine_logprobs(samples) -> torch.Tensor:
    return samples.logprobs[samples.response_mask]


def _zeroed(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every weight 0 but the (tied) embeddings: every logit is then 0."""
    zero = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in zero.named_parameters():
            if "embed_tokens" not in name:
                p.zero_()
    return zero


def test_the_cpu_platform_builds_without_sleep_mode_and_says_so(engine):
    built, before_push = engine
    assert built.device_type == "cpu" and built.sleep_level == 0
    assert built.notes == [
        "vLLM's cpu platform has no sleep mode: rollout.vllm.enable_sleep_mode skipped (the "
        "engine keeps its memory through the updates)"
    ]
    assert "built with dummy weights" in before_push and "call push_weights" in before_push
    # vLLM's CPU worker makes torch.set_num_threads a no-op for the process; the build puts it back
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    assert torch.get_num_threads() == threads + 1
    torch.set_num_threads(threads)


def test_a_push_streams_buckets_and_zero_weights_sample_uniformly(engine, tiny):
    built, _ = engine
    _, model, tokenizer = tiny
    assert len(list(weight_buckets(model, BUCKET_MB * 2**20))) > 1
    built.sleep()  # no sleep mode here: a no-op, and the push still lands
    built.push_weights(_zeroed(model))
    s = _sample(built, tokenizer, seed=1)
    lp = _engine_logprobs(s)
    vocab = model.config.vocab_size
    assert lp.numel() == 3 * 4 * 16  # uniform: eos is as unlikely as any token, nothing stops
    torch.testing.assert_close(lp, torch.full_like(lp, -math.log(vocab)), rtol=0, atol=1e-5)


def test_pushing_the_policy_back_gives_its_tokens_and_its_log_probs(engine, tiny):
    built, _ = engine
    _, model, tokenizer = tiny
    built.push_weights(model)
    first = _sample(built, tokenizer, seed=7)
    built.push_weights(_zeroed(model))
    built.push_weights(model)
    again = _sample(built, tokenizer, seed=7)
    assert torch.equal(first.response_ids, again.response_ids)
    assert torch.equal(first.logprobs, again.logprobs)
    # the same weights in float32: only the engine's kernels differ from the HF forward
    gap = (_engine_logprobs(first) - _policy_logprobs(first, model)).abs()
    assert float(gap.max()) < 1e-4, (float(gap.mean()), float(gap.max()))
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)), alpha=0.05)
    built.push_weights(other)
    after = _sample(built, tokenizer, seed=7)
    assert float((_engine_logprobs(after) - _policy_logprobs(after, other)).abs().max()) < 1e-4
    assert float((_engine_logprobs(after) - _policy_logprobs(after, model)).abs().mean()) > 0.01


def test_the_call_seed_decides_the_tokens(engine, tiny):
    built, _ = engine
    _, model, tokenizer = tiny
    built.push_weights(model)
    a = _sample(built, tokenizer, seed=5)
    _sample(built, tokenizer, seed=9)  # another call between: the seed, not the history, decides
    b = _sample(built, tokenizer, seed=5)
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, _sample(built, tokenizer, seed=6).response_ids)
    # greedy: vLLM refuses n > 1 at temperature 0; the engine asks for one and copies it
    p = prompts(tokenizer)
    g = built.sample(p, 3, 8, 0.0, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 5)
    assert g.response_ids.shape[0] == 9
    assert all(torch.equal(g.response_ids[i], g.response_ids[i - i % 3]) for i in range(9))


def test_samples_come_back_in_the_builtin_samplers_layout(base):
    path, model, tokenizer, p = base
    served = VllmEngine(path, dtype="float32", seed=0, max_model_len=160, enforce_eager=True)
    s = served.sample(p, 3, 24, 1.0, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 2)
    assert s.response_ids.shape[0] == len(p) * 3 and s.response_ids.shape[1] <= 24
    assert s.prompt_index.tolist() == [i for i in range(len(p)) for _ in range(3)]
    for r in range(len(p) * 3):  # left-padded prompts
        assert s.prompt_ids[r][s.prompt_mask[r]].tolist() == p[r // 3]
    ended = s.response_ids.gather(1, (s.lengths - 1)[:, None]).squeeze(1)
    assert torch.equal(s.finished, ended == tokenizer.eos_token_id)
    assert bool(s.finished.any()) and bool((s.lengths[~s.finished] == 24).all())
    assert bool((s.response_ids[~s.response_mask] == tokenizer.pad_token_id).all())
    assert bool((s.logprobs[~s.response_mask] == 0).all())
    # read from the checkpoint itself (no push): the model's own log-probs
    gap = (_engine_logprobs(s) - _policy_logprobs(s, model)).abs()
    assert float(gap.max()) < 1e-4, float(gap.max())
    empty = served.sample([], 4, 8, 1.0, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 1)
    assert empty.response_ids.shape == (0, 0) and empty.prompt_index.shape == (0,)


def test_a_weight_the_policy_lacks_fails_the_push(engine, tiny):
    built, _ = engine
    _, model, tokenizer = tiny
    lacking = copy.deepcopy(model)
    lacking.model.norm = nn.Identity()  # no model.norm.weight to push
    with pytest.raises(WeightPushError) as e:
        built.push_weights(lacking)
    assert "no weight for 1 vLLM parameter(s), e.g. ['model.norm.weight']" in str(e.value)
