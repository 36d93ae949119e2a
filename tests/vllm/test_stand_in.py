"""The stand-in for vLLM (tests/rollout/fake_vllm.py), which the default suite trains with, checked
against the real engine call by call, so that it cannot drift from it.

Each check builds the real ``vllm.LLM`` (vLLM's CPU build) and ``fake_vllm.LLM`` from the same model
folder with the same arguments, as vapo_lab.rollout.vllm_backend builds its engine, makes the same
calls on both and compares what comes back: equal where vLLM is deterministic (greedy tokens,
finish and stop reasons, log-probs to float32 rounding, ranks, the unwritten names of a weight
reload, the worker's parameter names, the errors of a refused request), and by structure and type
where it draws random numbers. The stand-in is imported as a plain module, not installed as
``vllm``.

Known, deliberate differences (inherent, so not fixed in the stand-in):

* Random streams. A seeded request's tokens differ between the two: vLLM's CPU build samples with
  a fused Gumbel-max kernel fed one seed a row per step (``forward_cpu`` in
  vllm/v1/sample/ops/topk_topp_sampler.py), vLLM on a GPU with its CUDA streams, the stand-in with
  torch's CPU exponential draws. What is checked instead: each engine repeats itself for a seed,
  sample k of a seed-s request is sample 0 of a seed-(s + k) one in both (vLLM's
  parallel_sampling.py; the stand-in's claim holds), a seeded request samples alike alone or in a
  batch, and each engine's log-probs and ranks are those of the model's own logits after
  temperature and top-p.
* The platform. The stand-in poses as vLLM's CUDA platform, the engine here is its CPU platform:
  the CPU engine refuses ``enable_sleep_mode=True`` at build ("Sleep mode is not supported on
  current platform"; asserted below, so a vLLM that adds it is noticed), so sleep/wake_up are not
  compared. ``kv_cache_memory_bytes`` is passed to both (vllm_backend passes it on the CPU
  platform only).
* A reload that raises breaks the real engine (its layers stay on the meta device); the stand-in
  then refuses to sample and to reload (RuntimeError both, compared below), but a real reload
  after the failure replays the failed weights or does not return, so it is not called here.
* A layer given part of its weights by a reload: the rest is uninitialised memory in vLLM, NaN in
  the stand-in; only the unwritten names are compared, not what either then samples.

What this comparison found and fixed in the stand-in (its docstring marks each point [checked]):
a tied lm_head's ``lm_head.weight`` is written into the embeddings, not refused; a layer given only
part of its weights by a reload loses the rest (vLLM reloads layer by layer), it did not; a refused
request (an empty or too long prompt, bad ``SamplingParams``) raises ``VLLMValidationError``, not a
ValueError, with vLLM's messages; greedy sampling with n > 1 and a temperature above 2 are refused;
an unexpected bias is skipped; a reload that raises breaks the engine; ``kv_cache_memory_bytes`` is
accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import fake_vllm
import pytest
import torch

from tests.vllm.conftest import prompts

pytestmark = pytest.mark.vllm

EXTENSION = "vapo_lab.rollout.vllm_worker.WeightLoader"
SETTINGS = {
    "dtype": "float32",
    "enforce_eager": True,
    "seed": 0,
    "worker_extension_cls": EXTENSION,
    "logprobs_mode": "processed_logprobs",
    "kv_cache_memory_bytes": 2**30,
}
TINY_LEN, BASE_LEN = 48, 160
ATOL = 1e-4  # float32: only the engines' kernels differ


@dataclass
class Pair:
    """The real engine and the stand-in, built alike, with their modules."""

    real: Any
    fake: Any
    vllm: Any

    def both(self):
        return ((self.real, self.vllm), (self.fake, fake_vllm))


def _build(vllm, folder, max_model_len: int, **extra) -> tuple[Any, Any]:
    kw = {"model": str(folder), "max_model_len": max_model_len, **SETTINGS, **extra}
    return vllm.LLM(**kw), fake_vllm.LLM(**kw)


@pytest.fixture(scope="module")
def in_process():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


@pytest.fixture(scope="module")
def base_pair(real_vllm, in_process, base):
    vllm, _ = real_vllm
    return Pair(*_build(vllm, base[0], BASE_LEN), vllm)


@pytest.fixture(scope="module")
def tiny_pair(real_vllm, in_process, tiny):
    """The tiny model's pair; the module's last test breaks it (a reload that raises)."""
    vllm, _ = real_vllm
    return Pair(*_build(vllm, tiny[0], TINY_LEN), vllm)


def _generate(llm, module, prompt_ids, **kw) -> list[Any]:
    params = module.SamplingParams(**{"logprobs": 0, "detokenize": False, **kw})
    return llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)


def _logprobs(c) -> list[float]:
    return [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]


def _ranks(c) -> list[int]:
    return [lp[t].rank for lp, t in zip(c.logprobs, c.token_ids)]


def _check_structure(outs, prompt_ids, n: int) -> None:
    """vLLM's output layout: one RequestOutput per prompt, in order; n completions by index; token
    ids a list of ints; logprobs one {token: Logprob} a token (logprobs=0: the sampled one)."""
    assert type(outs) is list and len(outs) == len(prompt_ids)
    for out, p in zip(outs, prompt_ids):
        assert type(out).__name__ == "RequestOutput" and out.finished
        assert list(out.prompt_token_ids) == p and type(out.request_id) is str
        assert type(out.outputs) is list and [c.index for c in out.outputs] == list(range(n))
        for c in out.outputs:
            assert type(c).__name__ == "CompletionOutput" and c.text == ""
            assert type(c.token_ids) is list and all(type(t) is int for t in c.token_ids)
            assert type(c.logprobs) is list and len(c.logprobs) == len(c.token_ids)
            for position, token in zip(c.logprobs, c.token_ids):
                assert type(position) is dict and list(position) == [token]
                lp = position[token]
                assert type(lp).__name__ == "Logprob" and type(lp.logprob) is float
                assert type(lp.rank) is int and lp.rank >= 1 and lp.decoded_token is None
            assert c.cumulative_logprob == pytest.approx(sum(_logprobs(c)), abs=1e-3)


def _assert_same_completions(real_outs, fake_outs) -> None:
    """Deterministic outputs: the same tokens, reasons, ranks; log-probs to float32 rounding."""
    assert len(real_outs) == len(fake_outs)
    for r, f in zip(real_outs, fake_outs):
        assert list(r.prompt_token_ids) == list(f.prompt_token_ids)
        assert len(r.outputs) == len(f.outputs)
        for rc, fc in zip(r.outputs, f.outputs):
            assert rc.index == fc.index and rc.token_ids == fc.token_ids
            assert (rc.finish_reason, rc.stop_reason) == (fc.finish_reason, fc.stop_reason)
            assert _ranks(rc) == _ranks(fc)
            gap = max((abs(a - b) for a, b in zip(_logprobs(rc), _logprobs(fc))), default=0.0)
            assert gap < ATOL, gap
            assert rc.cumulative_logprob == pytest.approx(fc.cumulative_logprob, abs=1e-3)


def _greedy(pair: Pair, prompt_ids, **kw) -> tuple[list[Any], list[Any]]:
    outs = [
        _generate(llm, module, prompt_ids, n=1, temperature=0.0, **kw)
        for llm, module in pair.both()
    ]
    for o in outs:
        _check_structure(o, prompt_ids, 1)
    _assert_same_completions(*outs)
    return outs[0], outs[1]


def _refusal(call) -> BaseException:
    with pytest.raises(Exception) as e:
        call()
    return e.value


# ---- building ------------------------------------------------------------------------------------


def test_both_build_alike_and_refuse_alike(base_pair, tiny, real_vllm):
    vllm, platform = real_vllm
    for llm in (base_pair.real, base_pair.fake):
        assert (
            llm.model_config.dtype is torch.float32 and llm.model_config.max_model_len == BASE_LEN
        )
    folder = tiny[0]
    # a context beyond the config's: ValueError (vLLM's is pydantic's ValidationError, a ValueError)
    for module in (vllm, fake_vllm):
        with pytest.raises(ValueError) as e:
            _build_one(module, folder, max_model_len=513)
        assert (
            "User-specified max_model_len (513) is greater than the derived max_model_len"
            in str(e.value)
        )
        with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_seq'"):
            _build_one(module, folder, max_model_len=TINY_LEN, max_num_seq=8)
    # the CPU platform has no sleep mode (the stand-in poses as CUDA, which has): a known difference
    assert platform.device_type == "cpu" and not platform.is_sleep_mode_available()
    with pytest.raises(ValueError, match="Sleep mode is not supported on current platform"):
        _build_one(vllm, folder, max_model_len=TINY_LEN, enable_sleep_mode=True)


def _build_one(module, folder, **kw) -> Any:
    return module.LLM(model=str(folder), **{**SETTINGS, **kw})


def test_housekeeping_calls_answer_alike(base_pair):
    for llm in (base_pair.real, base_pair.fake):
        assert llm.reset_prefix_cache() is True
        assert llm.collective_rpc("vapo_seed", args=(3,)) == [None]


def test_the_workers_have_the_same_vllm_parameter_names(base_pair, tiny_pair):
    def names(worker) -> list[str]:
        return sorted(n for n, _ in worker.get_model().named_parameters())

    for pair in (base_pair, tiny_pair):
        # collective_rpc takes a function of the worker in-process, as vLLM documents
        [real], [fake] = pair.real.collective_rpc(names), pair.fake.collective_rpc(names)
        assert real == fake
        assert "model.layers.0.self_attn.qkv_proj.weight" in real  # fused q/k/v and gate/up
        assert "model.layers.0.mlp.gate_up_proj.weight" in real
        assert "lm_head.weight" not in real  # tied: the embeddings only


# ---- sampling ------------------------------------------------------------------------------------


def test_greedy_generation_is_the_same(base_pair, base):
    _, _, tokenizer, p = base
    eos = tokenizer.eos_token_id
    real, _ = _greedy(base_pair, p, max_tokens=40, stop_token_ids=[eos])
    reasons = {c.finish_reason for out in real for c in out.outputs}
    assert "stop" in reasons  # the base model answers and ends with eos: stop_reason None
    assert all(c.stop_reason is None for out in real for c in out.outputs)
    cut, _ = _greedy(base_pair, p, max_tokens=3, stop_token_ids=[eos])
    assert all(
        c.finish_reason == "length" and len(c.token_ids) == 3 for o in cut for c in o.outputs
    )
    # greedy with n > 1: both refuse the request, with the same message
    errors = [
        _refusal(lambda m=module: m.SamplingParams(n=2, temperature=0.0))
        for _, module in base_pair.both()
    ]
    _assert_same_refusal(*errors)
    assert "n must be 1 when using greedy sampling, got 2." in str(errors[0])


def test_a_stop_token_ends_a_completion_with_its_id(base_pair, base):
    _, _, tokenizer, p = base
    eos = tokenizer.eos_token_id
    free, _ = _greedy(base_pair, p[:4], max_tokens=12, stop_token_ids=[eos])
    stop = free[0].outputs[0].token_ids[2]
    real, fake = _greedy(base_pair, p[:4], max_tokens=12, stop_token_ids=[eos, stop])
    first = real[0].outputs[0]
    assert first.finish_reason == "stop" and first.stop_reason == stop
    assert first.token_ids == free[0].outputs[0].token_ids[: first.token_ids.index(stop) + 1]
    # detokenized: the same text and token strings
    texts = [
        _generate(llm, module, p[:2], temperature=0.0, max_tokens=8, detokenize=True)
        for llm, module in base_pair.both()
    ]
    for r, f in zip(*texts):
        rc, fc = r.outputs[0], f.outputs[0]
        assert rc.token_ids == fc.token_ids and rc.text == fc.text
        assert [lp[t].decoded_token for lp, t in zip(rc.logprobs, rc.token_ids)] == [
            lp[t].decoded_token for lp, t in zip(fc.logprobs, fc.token_ids)
        ]


def test_seeded_sampling_repeats_and_seeds_sample_k_with_seed_plus_k(tiny_pair, tiny):
    _, model, tokenizer = tiny
    p = prompts(tokenizer)[:2]
    kw = {"temperature": 0.8, "top_p": 0.9, "max_tokens": 10}
    for llm, module in tiny_pair.both():
        three = _generate(llm, module, p, n=3, seed=11, **kw)
        _check_structure(three, p, 3)
        again = _generate(llm, module, p, n=3, seed=11, **kw)
        for a, b in zip(three, again):
            assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
            assert [_logprobs(c) for c in a.outputs] == [_logprobs(c) for c in b.outputs]
        assert len({tuple(c.token_ids) for c in three[0].outputs}) == 3  # three samples
        for k in range(3):  # alone, and first of a batch
            [alone] = _generate(llm, module, p[:1], n=1, seed=11 + k, **kw)
            assert alone.outputs[0].token_ids == three[0].outputs[k].token_ids, (module, k)
        # processed log-probs: the model's own, after temperature and top-p
        for out, prompt in zip(three, p):
            for c in out.outputs:
                want_lp, want_rank = _processed(model, prompt, c.token_ids, 0.8, 0.9)
                assert max(abs(a - b) for a, b in zip(_logprobs(c), want_lp)) < ATOL
                assert _ranks(c) == want_rank


@torch.no_grad()
def _processed(model, prompt, tokens, temperature: float, top_p: float):
    """The sampled tokens' log-probs and ranks after temperature and top-p (vLLM's
    apply_top_k_top_p: drop the least likely tokens whose mass stays within 1 - top_p), from one
    HF forward pass."""
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    lps, ranks = [], []
    for row, token in zip(logits / temperature, tokens):
        ascending, order = row.sort()
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[-1] = False
        row = row.scatter(-1, order, ascending.masked_fill(drop, -math.inf))
        lp = row.log_softmax(-1)
        lps.append(float(lp[token]))
        ranks.append(int((lp >= lp[token]).sum()))
    return lps, ranks


def test_requests_are_refused_alike(tiny_pair, tiny):
    tokenizer = tiny[2]
    bad_params = [
        {"n": 0},
        {"temperature": -0.5},
        {"temperature": 2.5},
        {"top_p": 0.0},
        {"max_tokens": 0},
        {"n": 3, "temperature": 0.0},
    ]
    for bad in bad_params:
        errors = [
            _refusal(lambda m=module: m.SamplingParams(**bad)) for _, module in tiny_pair.both()
        ]
        _assert_same_refusal(*errors)
    for prompt in ([], list(range(3, 3 + TINY_LEN)), list(range(3, 4 + TINY_LEN))):
        errors = [
            _refusal(lambda llm=llm, m=module: _generate(llm, m, [prompt], max_tokens=4))
            for llm, module in tiny_pair.both()
        ]
        _assert_same_refusal(*errors)
    # the context fills: finish_reason "length" at max_model_len, before max_tokens
    near = [[tokenizer.bos_token_id, *range(3, 3 + TINY_LEN - 4)]]
    real, _ = _greedy(tiny_pair, near, max_tokens=10)
    c = real[0].outputs[0]
    assert len(c.token_ids) <= 3 and (c.finish_reason == "length") == (len(c.token_ids) == 3)
    real, _ = _greedy(tiny_pair, prompts(tokenizer), max_tokens=5)
    assert all(
        c.finish_reason == "length" and len(c.token_ids) == 5 for o in real for c in o.outputs
    )


def _assert_same_refusal(real: BaseException, fake: BaseException) -> None:
    """The same class (by name: vllm.exceptions' own and the stand-in's), the same message (vLLM
    may append the parameter), and neither a ValueError."""
    assert type(real).__name__ == type(fake).__name__ == "VLLMValidationError", (real, fake)
    assert not isinstance(real, ValueError) and not isinstance(fake, ValueError)
    assert str(real).startswith(str(fake)), (str(real), str(fake))


# ---- weight reloads ------------------------------------------------------------------------------


def _reload(llm, pairs) -> list[str]:
    [unwritten] = llm.collective_rpc("vapo_reload_weights", args=(iter(list(pairs)),))
    return unwritten


def _reload_both(pair: Pair, pairs) -> list[str]:
    pairs = list(pairs)
    real, fake = _reload(pair.real, pairs), _reload(pair.fake, pairs)
    assert real == fake
    return real


def test_reloads_leave_the_same_parameters_unwritten(base_pair, base):
    _, model, _, p = base
    weights = [(n, t.detach()) for n, t in model.named_parameters()]
    before, _ = _greedy(base_pair, p[:4], max_tokens=16)
    everything = sorted(n for n, _ in base_pair.fake.worker.get_model().named_parameters())
    try:
        assert _reload_both(base_pair, weights) == []
        assert _reload_both(base_pair, []) == everything
        subset = [(n, t) for n, t in weights if n != "model.norm.weight" and ".layers.1." not in n]
        unwritten = _reload_both(base_pair, subset)
        assert "model.norm.weight" in unwritten and len(unwritten) == 8  # norm + layer 1's 7
        # part of a layer: its fused weight counts as written (its bias does not), and the rest of
        # the layer is undefined in both (vLLM rebuilds it from fresh memory): not sampled from
        [q] = [(n, t) for n, t in weights if n == "model.layers.0.self_attn.q_proj.weight"]
        unwritten = _reload_both(base_pair, [q])
        assert "model.layers.0.self_attn.qkv_proj.weight" not in unwritten
        assert "model.layers.0.self_attn.qkv_proj.bias" in unwritten
        assert _reload_both(base_pair, weights) == []
        # layer 2 changed, the rest given nothing: both keep the rest and sample alike
        noise = torch.Generator().manual_seed(3)
        layer2 = [
            (n, t + 0.05 * torch.randn(t.shape, generator=noise))
            for n, t in weights
            if ".layers.2." in n
        ]
        assert len(_reload_both(base_pair, layer2)) == len(everything) - 7
        after, _ = _greedy(base_pair, p[:4], max_tokens=16)
        assert [c.token_ids for o in after for c in o.outputs] != [
            c.token_ids for o in before for c in o.outputs
        ]
    finally:
        _reload(base_pair.real, weights), _reload(base_pair.fake, weights)
    again, _ = _greedy(base_pair, p[:4], max_tokens=16)
    assert [c.token_ids for o in again for c in o.outputs] == [
        c.token_ids for o in before for c in o.outputs
    ]


def test_a_tied_lm_head_weight_and_an_unexpected_bias(tiny_pair, tiny):
    _, model, tokenizer = tiny
    weights = [(n, t.detach()) for n, t in model.named_parameters()]
    everything = sorted(n for n, _ in tiny_pair.fake.worker.get_model().named_parameters())
    before, _ = _greedy(tiny_pair, prompts(tokenizer), max_tokens=8)
    try:
        # written into the shared embedding, reported as "lm_head.weight": the embedding counts
        # as unwritten, yet both now sample from the doubled one
        head = [("lm_head.weight", 2 * model.lm_head.weight.detach())]
        assert _reload_both(tiny_pair, head) == everything
        after, _ = _greedy(tiny_pair, prompts(tokenizer), max_tokens=8)
        assert [c.token_ids for o in after for c in o.outputs] != [
            c.token_ids for o in before for c in o.outputs
        ]
        # a bias the model lacks is skipped (AutoWeightsLoader ignores unexpected biases)
        bias = [("model.layers.0.mlp.down_proj.bias", torch.ones(model.config.hidden_size))]
        assert _reload_both(tiny_pair, bias) == everything
    finally:
        _reload(tiny_pair.real, weights), _reload(tiny_pair.fake, weights)
    _greedy(tiny_pair, prompts(tokenizer), max_tokens=8)


def test_last_a_reload_that_raises_breaks_both(tiny_pair, tiny):
    """Runs last in this module: it leaves the tiny pair unusable."""
    _, _, tokenizer = tiny
    unknown = [("model.layers.0.foo.weight", torch.zeros(3))]
    errors = [
        _refusal(lambda llm=llm: _reload(llm, unknown)) for llm in (tiny_pair.real, tiny_pair.fake)
    ]
    for e in errors:
        assert type(e) is ValueError
        assert "There is no module or parameter named 'layers.0.foo' in Qwen2Model" in str(e)
    for llm, module in tiny_pair.both():
        with pytest.raises(RuntimeError):  # the CPU build: NotImplementedError (meta tensors)
            _generate(llm, module, prompts(tokenizer), temperature=0.0, max_tokens=2)
