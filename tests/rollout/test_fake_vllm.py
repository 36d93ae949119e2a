"""The CPU stand-in for vLLM 0.33 (fake_vllm.py) behaves as its docstring says vLLM does, where the
backend's tests rely on it: output types, sleep levels, vLLM parameter names, limits, seeds."""

from __future__ import annotations

import fake_vllm
import pytest
import torch
from fake_vllm import (
    LLM,
    CompletionOutput,
    Logprob,
    RequestOutput,
    SamplingParams,
    VLLMValidationError,
)

EXTENSION = "vapo_lab.rollout.vllm_worker.WeightLoader"
PROMPT = [267, 296, 455, 330, 340, 456]


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _llm(path, **kwargs) -> LLM:
    kw = {
        "dtype": "float32",
        "seed": 0,
        "enable_sleep_mode": True,
        "worker_extension_cls": EXTENSION,
        "logprobs_mode": "processed_logprobs",
        **kwargs,
    }
    return LLM(str(path), **kw)


def _generate(
    llm: LLM, n: int = 2, seed: int | None = 1, max_tokens: int = 6, **kw
) -> list[RequestOutput]:
    params = SamplingParams(
        n=n, temperature=1.0, top_p=1.0, max_tokens=max_tokens, logprobs=0, seed=seed, **kw
    )
    return llm.generate([{"prompt_token_ids": PROMPT}], [params], use_tqdm=False)


def test_outputs_have_vllm_033s_types(in_process, tiny):
    _, path, _, tokenizer = tiny
    llm = _llm(path)
    # the config's
    assert llm.model_config.dtype is torch.float32 and llm.model_config.max_model_len == 512
    [out] = _generate(llm, n=3, max_tokens=4)
    assert isinstance(out, RequestOutput) and out.prompt_token_ids == PROMPT and out.finished
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert isinstance(c, CompletionOutput) and c.finish_reason in ("stop", "length")
        assert type(c.token_ids) is list and all(type(t) is int for t in c.token_ids)
        assert len(c.logprobs) == len(c.token_ids)
        for position, token in zip(c.logprobs, c.token_ids):
            assert list(position) == [token]  # logprobs=0: the sampled token only
            lp = position[token]
            assert isinstance(lp, Logprob) and type(lp.logprob) is float and lp.logprob <= 0
            assert type(lp.rank) is int and lp.rank >= 1
            assert lp.decoded_token == tokenizer.convert_ids_to_tokens(token)
        assert c.cumulative_logprob == pytest.approx(
            sum(p[t].logprob for p, t in zip(c.logprobs, c.token_ids))
        )


def test_the_kth_sample_is_seeded_with_seed_plus_k(in_process, tiny):
    llm = _llm(tiny[1])
    pair = _generate(llm, n=2, seed=7)[0].outputs
    second = _generate(llm, n=1, seed=8)[0].outputs[0]
    # the same draws (log-probs to rounding: a batch of 1, not 2)
    assert pair[1].token_ids == second.token_ids
    assert [lp[t].logprob for lp, t in zip(pair[1].logprobs, pair[1].token_ids)] == pytest.approx(
        [lp[t].logprob for lp, t in zip(second.logprobs, second.token_ids)], abs=1e-5
    )
    assert _generate(llm, n=2, seed=7)[0].outputs == pair


def test_level_2_discards_the_weights_and_level_1_keeps_them(in_process, tiny):
    llm = _llm(tiny[1])
    greedy = SamplingParams(temperature=0.0, max_tokens=5, logprobs=0)
    before = llm.generate([{"prompt_token_ids": PROMPT}], [greedy])[0].outputs[0]
    llm.sleep(level=1)
    assert llm.wake_up(tags=["weights"]) is False  # the KV cache still sleeps: not scheduling yet
    with pytest.raises(RuntimeError, match="LLM.generate would not return"):
        llm.generate([{"prompt_token_ids": PROMPT}], [greedy])
    assert llm.wake_up(tags=["kv_cache"]) is True
    assert llm.generate([{"prompt_token_ids": PROMPT}], [greedy])[0].outputs[0] == before

    llm.sleep(level=2)
    assert llm.wake_up() is True  # awake, with nothing pushed: garbage weights
    [garbage] = _generate(llm, n=1)[0].outputs
    # NaN
    assert all(lp[t].logprob != lp[t].logprob for lp, t in zip(garbage.logprobs, garbage.token_ids))


def test_the_worker_model_has_vllms_names_and_loader(in_process, tiny):
    _, path, policy, _ = tiny
    llm = _llm(path)
    model = llm.worker.get_model()
    names = [n for n, _ in model.named_parameters()]
    assert (
        "model.layers.0.self_attn.qkv_proj.weight" in names
        and "model.layers.0.mlp.gate_up_proj.weight" in names
    )
    # fused; tied
    assert not any(".q_proj." in n or ".gate_proj." in n or n == "lm_head.weight" for n in names)
    loaded = model.load_weights(
        [
            ("model.layers.1.self_attn.k_proj.bias", torch.ones(32)),
            ("model.norm.weight", torch.zeros(64)),
        ]
    )
    assert loaded == {"model.layers.1.self_attn.qkv_proj.bias", "model.norm.weight"}
    qkv = dict(model.named_parameters())["model.layers.1.self_attn.qkv_proj.bias"]
    assert torch.equal(qkv[64:96], torch.ones(32))  # k's rows: after q's 64 (4 heads x 16)
    assert torch.equal(llm.hf.model.layers[1].self_attn.k_proj.bias, torch.ones(32))  # what samples
    # tied: written into the shared embedding, returned under its own name (as vLLM 0.32 does)
    embed = dict(model.named_parameters())["model.embed_tokens.weight"]
    assert model.load_weights([("lm_head.weight", torch.ones_like(embed))]) == {"lm_head.weight"}
    assert bool((embed == 1).all()) and bool((llm.hf.lm_head.weight == 1).all())
    # an unexpected bias is skipped, any other unknown name refused
    assert model.load_weights([("model.layers.0.mlp.down_proj.bias", torch.ones(64))]) == set()
    with pytest.raises(ValueError, match="no module or parameter named 'layers.0.foo' in Qwen2"):
        model.load_weights([("model.layers.0.foo.weight", torch.ones(64))])


def test_a_layer_given_part_of_its_weights_loses_the_rest(in_process, tiny):
    _, path, policy, _ = tiny
    llm = _llm(path)
    q = policy.model.layers[0].self_attn.q_proj.weight.detach()
    unwritten = llm.collective_rpc(
        "vapo_reload_weights", args=(iter([("model.layers.0.self_attn.q_proj.weight", q)]),)
    )[0]
    assert "model.layers.0.self_attn.qkv_proj.weight" not in unwritten  # counted as written
    params = dict(llm.worker.get_model().named_parameters())
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]], q) and bool(qkv[q.shape[0] :].isnan().all())
    assert bool(params["model.layers.0.self_attn.qkv_proj.bias"].isnan().all())  # same layer
    assert not params["model.layers.0.self_attn.o_proj.weight"].isnan().any()  # given nothing
    assert not params["model.layers.0.mlp.gate_up_proj.weight"].isnan().any()


def test_a_reload_that_raises_breaks_the_engine(in_process, tiny):
    llm = _llm(tiny[1])
    with pytest.raises(AssertionError, match=r"Attempted to load weight \(torch.Size\(\[3\]\)\)"):
        llm.collective_rpc(
            "vapo_reload_weights", args=(iter([("model.norm.weight", torch.ones(3))]),)
        )
    with pytest.raises(RuntimeError, match="an earlier reload raised"):
        _generate(llm)
    with pytest.raises(RuntimeError, match="an earlier reload raised"):
        llm.collective_rpc("vapo_reload_weights", args=(iter(()),))


def test_limits_of_the_context_and_the_settings(in_process, tiny):
    path = tiny[1]
    with pytest.raises(
        ValueError, match=r"User-specified max_model_len \(513\) is greater than the derived"
    ):
        _llm(path, max_model_len=513)
    llm = _llm(path, max_model_len=len(PROMPT) + 3)
    [c] = _generate(llm, n=1, max_tokens=10)[0].outputs
    assert len(c.token_ids) <= 3 and (c.finish_reason == "length") == (len(c.token_ids) == 3)
    with pytest.raises(VLLMValidationError, match="longer than the maximum model length of 9"):
        llm.generate([{"prompt_token_ids": list(range(1, 10))}], [SamplingParams()])
    assert not issubclass(VLLMValidationError, ValueError)  # as vllm.exceptions' own
    with pytest.raises(VLLMValidationError, match="n must be 1 when using greedy sampling"):
        SamplingParams(n=2, temperature=0.0)
    with pytest.raises(VLLMValidationError, match=r"temperature must be in \[0, 2\]"):
        SamplingParams(temperature=2.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_seq'"):
        _llm(path, max_num_seq=8)


def test_the_worker_extension_is_mixed_in_and_checked(in_process, tiny, monkeypatch):
    llm = _llm(tiny[1])
    # nothing pushed: every parameter is named as unwritten
    assert llm.collective_rpc("vapo_reload_weights", args=(iter(()),)) == [
        sorted(n for n, _ in llm.worker.get_model().named_parameters())
    ]

    class Clash:
        def get_model(self):
            return None

    monkeypatch.setattr(fake_vllm, "Clash", Clash, raising=False)
    with pytest.raises(AssertionError, match="already has an attribute get_model"):
        _llm(tiny[1], worker_extension_cls="fake_vllm.Clash")


def test_tensors_do_not_reach_an_engine_core_in_another_process(tiny, monkeypatch):
    # vLLM's default: multiprocessing
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    llm = _llm(tiny[1])
    with pytest.raises(TypeError, match="tensors do not reach it as tensors"):
        llm.collective_rpc("vapo_reload_weights", args=([("model.norm.weight", torch.zeros(64))],))
