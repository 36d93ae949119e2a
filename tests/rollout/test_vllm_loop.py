"""The vLLM backend's whole loop on CPU, against the stand-in for vLLM 0.33 (fake_vllm.py) serving
the tiny model: build through ``make_engine``, sample, update the policy, sleep, push, sample
again; the engine's context; the samples' layout; and tensor-parallel groups over two gloo
ranks."""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from datetime import timedelta

import fake_vllm
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vapo_lab.rollout import make_engine
from vapo_lab.rollout.sampler import Samples, sample
from vapo_lab.rollout.vllm_backend import EngineGroupError, VllmEngine, WeightPushError

# two trainer ranks sharing one engine
TP2 = ("trainer.strategy=fsdp", "trainer.nproc_per_node=2", "rollout.vllm.tensor_parallel_size=2")
# "x1_4 x2_8 + y1_5 y2_0 =", "x2_8 + y2_0 ="
PROMPTS = [
    [267, 296, 455, 330, 340, 456],
    [296, 455, 340, 456],
]
# the prompt tokens an engine of these tests is built for (its max_model_len: + max_new_tokens)
BUDGET = 16


def _sample(
    engine, tokenizer, prompts=PROMPTS, n: int = 2, seed: int = 5, max_new_tokens: int = 8
) -> Samples:
    return engine.sample(
        prompts, n, max_new_tokens, 1.0, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, seed
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Returns the tensor's bit patterns (so -0.0 differs from 0.0 and NaN from everything)."""
    return t.contiguous().view(
        {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    )


@torch.no_grad()
def _logprobs_under(model, s: Samples) -> list[torch.Tensor]:
    """Returns, per row, the sampled tokens' log-probs under ``model`` (temperature 1), from one
    full forward."""
    out = []
    for r in range(s.response_ids.shape[0]):
        prompt, response = s.prompt_ids[r][s.prompt_mask[r]], s.response_ids[r, : int(s.lengths[r])]
        logits = (
            model(input_ids=torch.cat([prompt, response])[None])
            .logits[0, len(prompt) - 1 : -1]
            .float()
        )
        out.append(logits.log_softmax(-1).gather(-1, response[:, None]).squeeze(-1))
    return out


def _engine(path, cfg, prompt_tokens: int = BUDGET, **vllm):
    """The engine of ``cfg`` over the checkpoint at ``path``, built for prompts of
    ``prompt_tokens``: loaded from the checkpoint and seeding each request unless ``vllm`` says
    otherwise."""
    context = prompt_tokens + cfg.rollout.max_new_tokens
    settings = dataclasses.replace(
        cfg.rollout.vllm, **{"dummy_weights": False, "seed_per_request": True, **vllm}
    )
    return make_engine(path, settings, cfg.model, cfg.seed, context)


def _gap(s: Samples, model) -> float:
    """Returns the mean |engine log-prob - log-prob under ``model``| over the sampled tokens."""
    ref = _logprobs_under(model, s)
    return float(torch.cat([(s.logprobs[r, : len(x)] - x).abs() for r, x in enumerate(ref)]).mean())


def _one_step(policy, s: Samples, lr: float = 0.05) -> None:
    """One AdamW step of the policy on its samples (cross-entropy of the sampled sequences)."""
    policy.train()
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    ids = torch.cat([s.prompt_ids, s.response_ids], 1)
    policy(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    policy.eval()


# ---- one rank ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sample_update_sleep_push_sample(vllm_on_cpu, tiny, compose, dtype):
    cfg, path, base, tokenizer = tiny
    # vLLM samples in model.dtype; the policy trains in float32
    cfg = compose(f"model.dtype={dtype}")
    engine = _engine(path, cfg)
    assert engine.dtype == getattr(torch, dtype) and engine.sleep_level == 2
    policy = copy.deepcopy(base)
    _one_step(policy, _sample(engine, tokenizer))

    engine.sleep()
    with pytest.raises(WeightPushError, match="call push_weights"):
        _sample(engine, tokenizer)  # level 2 discarded the weights
    engine.push_weights(policy)

    served = engine.llm.worker.get_model().hf_state()
    for name, p in policy.named_parameters():
        want = p.detach().to(engine.dtype)
        assert served[name].dtype == engine.dtype and torch.equal(
            _bits(served[name]), _bits(want)
        ), name
    after = _sample(engine, tokenizer)
    if dtype == "float32":  # the same weights and arithmetic: only the KV-cache path differs
        assert _gap(after, policy) < 1e-4 < 0.05 < _gap(after, base)
    else:
        assert _gap(after, policy.to(torch.bfloat16)) < 0.05 < _gap(after, base)


def test_samples_are_cpu_tensors_in_the_builtin_samplers_layout(vllm_on_cpu, tiny):
    cfg, path, base, tokenizer = tiny
    s = _sample(_engine(path, cfg), tokenizer, n=3)
    builtin = sample(
        base,
        PROMPTS,
        n=3,
        max_new_tokens=8,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )
    assert type(s) is Samples
    for f in dataclasses.fields(Samples):
        mine, theirs = getattr(s, f.name), getattr(builtin, f.name)
        # vLLM returns Python lists: the trainer moves them to its device, as it does the builtin's
        assert mine.device.type == "cpu" and mine.dtype == theirs.dtype, f.name
        assert mine.shape[0] == theirs.shape[0] == len(PROMPTS) * 3, f.name
    assert s.prompt_ids.shape == builtin.prompt_ids.shape and s.response_ids.shape[1] <= 8
    assert torch.equal(s.prompt_index, builtin.prompt_index)
    ended = s.response_ids.gather(1, (s.lengths - 1)[:, None]).squeeze(1)
    assert torch.equal(s.finished, ended == tokenizer.eos_token_id)
    assert bool((s.response_ids[~s.response_mask] == tokenizer.pad_token_id).all())
    assert bool((s.logprobs[~s.response_mask] == 0).all()) and bool(
        (s.logprobs[s.response_mask] < 0).all()
    )


def test_two_copies_of_a_prompt_are_sampled_independently(vllm_on_cpu, tiny):
    cfg, path, _, tokenizer = tiny
    engine = _engine(path, cfg)
    s = _sample(engine, tokenizer, prompts=[PROMPTS[0]] * 2, n=2, seed=5)
    # prompt i: seed + i * n
    assert engine.llm.calls[-1] == (
        "generate",
        ([PROMPTS[0]] * 2, [5, 7]),
    )
    assert not torch.equal(s.response_ids[:2], s.response_ids[2:])


def test_a_dummy_engine_samples_the_policy_only_once_it_is_pushed(vllm_on_cpu, tiny):
    cfg, path, base, tokenizer = tiny
    engine = _engine(path, cfg, dummy_weights=True)
    with pytest.raises(WeightPushError, match="dummy weights.*call push_weights"):
        _sample(engine, tokenizer)
    engine.push_weights(base)
    served = engine.llm.worker.get_model().hf_state()
    for name, p in base.named_parameters():
        assert torch.equal(_bits(served[name]), _bits(p.detach().to(engine.dtype))), name
    # from the pushed weights, the samples of an engine that read the checkpoint itself
    loaded = _engine(path, cfg)
    a, b = _sample(engine, tokenizer), _sample(loaded, tokenizer)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)


def test_one_seed_a_call_keeps_requests_unseeded_and_samples_reproducible(vllm_on_cpu, tiny):
    cfg, path, _, tokenizer = tiny
    one, two = (_engine(path, cfg, seed_per_request=False) for _ in range(2))
    a = _sample(one, tokenizer, seed=5)
    # no request carries a seed, so vLLM keeps its batched sampler; nor asks for text
    assert one.llm.calls[-1] == ("generate", (PROMPTS, [None] * len(PROMPTS)))
    assert all(not sp.detokenize for sp in one.llm.params_seen)
    _sample(two, tokenizer, seed=9)  # another call between: the seed, not the history, decides
    b = _sample(two, tokenizer, seed=5)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, _sample(one, tokenizer, seed=6).response_ids)


# ---- the engine's context ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny", "hf"])
def test_max_model_len_is_the_longest_prompt_plus_max_new_tokens(
    vllm_on_cpu, compose, save_tiny, tmp_path, model
):
    from vapo_lab.trainer.setup import longest_prompt, make_sampling, task_for

    cfg = compose("task.options.max_digits=5", "rollout.max_new_tokens=20")
    policy, tokenizer = save_tiny(cfg, tmp_path)
    if model == "hf":
        cfg = compose(
            "task.options.max_digits=5",
            "rollout.max_new_tokens=20",
            "model=hf",
            f"model.path={tmp_path}",
        )
    # the longest of 144 problems of up to 5 digits is "x1_D .. x5_D + y1_D .. y5_D =":
    #   2 * 5 + 2 = 12 tokens
    task = task_for(cfg.task)
    assert longest_prompt(task, tokenizer, cfg.model.chat_template)[0] == 12
    engine = make_sampling(
        cfg.rollout, cfg.model, cfg.seed, policy, tokenizer, tmp_path, task
    ).engine
    assert engine.llm.model_config.max_model_len == 12 + 20


# ---- two ranks, one engine of tensor_parallel_size=2 ------------------------------------------


def _rank(
    rank: int, world: int, init_file: str, cfg, path: str, ids: tuple[int, int], results: dict
) -> None:
    """One gloo rank of a tensor-parallel pair: a push, then both sample ("lockstep"); then a second
    engine that only rank 0 samples ("alone")."""
    torch.set_num_threads(1)
    fake_vllm.install()
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        results[("lockstep", rank)] = _lockstep(rank, cfg, path, ids)
        _alone(rank, path, ids, results)
    finally:
        dist.destroy_process_group()


def _updated_policy(path: str):
    """The checkpoint at ``path`` with the same noise added on every rank: an update."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        for i, p in enumerate(policy.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)), alpha=0.05)
    return policy


def _rank_prompts(rank: int) -> list[list[int]]:
    return PROMPTS[:1] if rank == 0 else [PROMPTS[1], PROMPTS[0][1:]]  # uneven shares


def _lockstep(rank: int, cfg, path: str, ids: tuple[int, int]) -> dict:
    engine = _engine(path, cfg)
    policy = _updated_policy(path)
    engine.sleep()
    engine.push_weights(policy)
    s = engine.sample(_rank_prompts(rank), 2, 6, 1.0, 1.0, *ids, 100 + rank)
    served = engine.llm.worker.get_model().hf_state()
    return {
        "generate": engine.llm.calls[-1],
        "samples": {f.name: getattr(s, f.name).tolist() for f in dataclasses.fields(Samples)},
        "pushed": all(torch.equal(served[n], p) for n, p in policy.named_parameters()),
    }


def _alone(rank: int, path: str, ids: tuple[int, int], results: dict) -> None:
    engine = VllmEngine(
        path,
        dtype="float32",
        seed=0,
        max_model_len=32,
        tensor_parallel_size=2,
        rank=rank,
        world_size=2,
        lockstep_timeout_s=3,
    )
    if rank == 1:
        while ("alone", 0) not in results:  # not a collective: rank 1 never samples
            time.sleep(0.1)
        return
    start = time.monotonic()
    try:
        engine.sample(PROMPTS[:1], 2, 6, 1.0, 1.0, *ids, 100)
        results[("alone", 0)] = {"error": None}
    except EngineGroupError as e:
        results[("alone", 0)] = {"error": str(e), "seconds": time.monotonic() - start}


@pytest.fixture(scope="module")
def pair(tiny, compose, tmp_path_factory) -> dict:
    """What two spawned gloo ranks sharing one engine of tensor_parallel_size=2 saw."""
    _, path, _, tokenizer = tiny
    store = tmp_path_factory.mktemp("pair") / "store"
    with mp.Manager() as manager:
        results = manager.dict()
        ids = (tokenizer.eos_token_id, tokenizer.pad_token_id)
        mp.spawn(_rank, args=(2, str(store), compose(*TP2), str(path), ids, results), nprocs=2)
        return dict(results)


@pytest.mark.timeout(120)
def test_a_tensor_parallel_pair_samples_in_lockstep_and_each_rank_gets_its_rows(
    vllm_on_cpu, tiny, pair
):
    _, path, _, tokenizer = tiny
    # the group ran every rank's requests, each with its rank's seeds (prompt i: seed + i * n)
    both = ("generate", ([PROMPTS[0], PROMPTS[1], PROMPTS[0][1:]], [100, 101, 103]))
    assert pair[("lockstep", 0)]["generate"] == pair[("lockstep", 1)]["generate"] == both
    assert pair[("lockstep", 0)]["pushed"] and pair[("lockstep", 1)]["pushed"]
    # each rank's rows are those of its own prompts, as a one-rank engine with the same weights
    # samples them
    engine = VllmEngine(path, dtype="float32", seed=0, max_model_len=32, seed_per_request=True)
    engine.push_weights(_updated_policy(str(path)))
    for rank in (0, 1):
        alone = engine.sample(
            _rank_prompts(rank),
            2,
            6,
            1.0,
            1.0,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            100 + rank,
        )
        got = pair[("lockstep", rank)]["samples"]
        assert len(got["prompt_index"]) == 2 * len(_rank_prompts(rank))
        for f in dataclasses.fields(Samples):
            want = getattr(alone, f.name)
            torch.testing.assert_close(
                torch.tensor(got[f.name], dtype=want.dtype),
                want,
                rtol=0,
                atol=1e-5,
                msg=lambda m: f"rank {rank}, {f.name}: {m}",
            )


@pytest.mark.timeout(120)
def test_a_rank_sampling_without_its_group_fails_instead_of_hanging(pair):
    r = pair[("alone", 0)]
    assert r["error"] is not None and r["seconds"] < 30, r
    assert (
        "rank 0 of a tensor-parallel vLLM group (rollout.vllm.tensor_parallel_size=2)" in r["error"]
    )
    assert (
        "every rank of a group must call sample equally often, a rank without prompts too"
        in r["error"]
    )
