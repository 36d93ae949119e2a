"""GPU tests of the vLLM backend: a real vLLM 0.33 engine beside a policy. NOT run here: no GPU.

Run them in the GPU environment (docs/distributed.md, "GPU / vLLM") on a machine with a CUDA GPU:

    pytest -m gpu tests/rollout/test_vllm_gpu.py

They are skipped where vLLM or a CUDA GPU is missing; the two-rank tests need 2 GPUs. The model is
vapo-lab's embedded tiny Qwen2 (``build_tiny_model``, tied embeddings), saved in HF format with its
tokenizer. Log-prob checks: vLLM samples in bf16, the reference is the same weights in fp32 on
the GPU. On CPU, with the built-in sampler's samples of the seed-0 model, the mean |log-prob gap|
per token was 0.014 under a bf16 copy of that model and 1.37 under the seed-1 or seed-2 model, so
the tests call a gap below 0.05 a match and one above 0.3 a different model.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vapo_lab.models.tiny import build_tiny_model
from vapo_lab.models.tokenizer import build_tokenizer
from vapo_lab.rollout.vllm_backend import VllmEngine, WeightPushError
from vapo_lab.tasks.arith import ArithTask

pytestmark = pytest.mark.gpu

TEXTS = ["1+2=", "37+5=", "4+4="]
MATCH, DIFFER = 0.05, 0.3  # mean |log-prob gap| per token: same weights / different weights


def _tokenizer():
    return build_tokenizer(ArithTask(seed=0, n_train=4, n_eval=2).vocabulary())


def _prompts(tokenizer, texts):
    return [[tokenizer.bos_token_id, *tokenizer(text).input_ids] for text in texts]


@torch.no_grad()
def _mean_gap(samples, model, temperature: float = 1.0) -> float:
    """Returns the mean |vLLM log-prob − log-prob under ``model``| over the sampled tokens."""
    device = next(model.parameters()).device
    gaps = []
    for r in range(samples.response_ids.shape[0]):
        prompt = samples.prompt_ids[r][samples.prompt_mask[r]]
        response = samples.response_ids[r, : int(samples.lengths[r])]
        ids = torch.cat([prompt, response])[None].to(device)
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        ref = logits.log_softmax(-1).gather(-1, response.to(device)[:, None]).squeeze(-1).cpu()
        gaps.append((samples.logprobs[r, : len(response)] - ref).abs())
    return float(torch.cat(gaps).mean())


def _sample(engine, tokenizer, seed: int, temperature: float = 1.0, texts=TEXTS):
    return engine.sample(
        _prompts(tokenizer, texts),
        n=4,
        max_new_tokens=16,
        temperature=temperature,
        top_p=1.0,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        seed=seed,
    )


def _need(gpus: int) -> None:
    pytest.importorskip("vllm")
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} CUDA GPU(s)")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(model directory, tokenizer): the tiny model of seed 0 in HF format, with its tokenizer."""
    tokenizer = _tokenizer()
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


# ---- two ranks (first: before this process holds an engine) ----------------------------------


@pytest.mark.parametrize("tp", [1, 2])
def test_two_ranks_push_from_fsdp2_shards_and_sample(saved, tmp_path, tp):
    """torchrun, 2 ranks: external_launcher engines (tp=1: one per rank; tp=2: one shared by
    both)."""
    _need(2)
    path, _ = saved
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            __file__,
            str(path),
            str(tmp_path),
            str(tp),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for rank in (0, 1):
        r = json.loads((tmp_path / f"{rank}.json").read_text())
        # each rank gets back its own prompts' samples
        assert r["rows"] == 4 * (1 if rank == 0 else 2)
        assert r["gap_new"] < MATCH < DIFFER < r["gap_old"], r


def _rank_main(model_dir: str, out_dir: str, tp: str) -> None:
    """One rank of the two-rank test (run by torchrun): FSDP2-shard a new policy, push, sample."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer = _tokenizer()
    engine = VllmEngine(
        model_dir,
        dtype="bfloat16",
        seed=0,
        max_model_len=512,
        gpu_memory_utilization=0.3,
        tensor_parallel_size=int(tp),
        enforce_eager=True,
        enable_sleep_mode=True,
        sleep_level=2,
        rank=rank,
        world_size=world,
    )
    old, new = (
        build_tiny_model(tokenizer, seed=0).cuda(),
        build_tiny_model(tokenizer, seed=1).cuda(),
    )
    sharded = copy.deepcopy(new)
    mesh = init_device_mesh("cuda", (world,))
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)  # the root group keeps the tied embedding with the head
    engine.sleep()
    engine.push_weights(sharded)
    s = _sample(engine, tokenizer, seed=rank, texts=TEXTS[:1] if rank == 0 else TEXTS[1:])
    result = {
        "rows": s.response_ids.shape[0],
        "gap_new": _mean_gap(s, new),
        "gap_old": _mean_gap(s, old),
    }
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# ---- one engine in this process --------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(saved):
    _need(1)
    path, _ = saved
    return VllmEngine(
        path,
        dtype="bfloat16",
        seed=0,
        max_model_len=512,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        enable_sleep_mode=True,
        sleep_level=2,
    )


def test_samples_come_from_the_loaded_checkpoint(engine, saved):
    _, tokenizer = saved
    s = _sample(engine, tokenizer, seed=1)
    assert s.response_ids.shape[0] == 4 * len(TEXTS) and int(s.lengths.max()) <= 16
    assert s.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert _mean_gap(s, build_tiny_model(tokenizer, seed=0).cuda()) < MATCH


def test_level_2_sleep_frees_memory_and_a_push_brings_the_new_policy(engine, saved):
    _, tokenizer = saved
    old, new = (
        build_tiny_model(tokenizer, seed=0).cuda(),
        build_tiny_model(tokenizer, seed=1).cuda(),
    )
    before = _sample(engine, tokenizer, seed=1)
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    engine.sleep()
    # the KV cache (GiBs at 0.3 of a GPU) is released
    assert torch.cuda.mem_get_info()[0] - free > 2**30
    with pytest.raises(WeightPushError, match="call push_weights"):
        _sample(engine, tokenizer, seed=1)  # level 2 discarded the weights
    engine.push_weights(new)
    engine.wake()
    after = _sample(engine, tokenizer, seed=1)
    assert _mean_gap(after, new) < MATCH < DIFFER < _mean_gap(after, old)
    assert not torch.equal(after.response_ids, before.response_ids)
    engine.push_weights(old)  # back to the checkpoint for the next tests


def test_level_1_sleep_keeps_the_weights(engine, saved):
    _, tokenizer = saved
    engine.sleep_level = 1
    try:
        greedy = _sample(engine, tokenizer, seed=0, temperature=0.0)
        engine.sleep()
        engine.wake()
        assert torch.equal(
            _sample(engine, tokenizer, seed=0, temperature=0.0).response_ids, greedy.response_ids
        )
    finally:
        engine.sleep_level = 2


def test_push_from_a_one_rank_fsdp2_policy(engine, saved, tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _, tokenizer = saved
    if not dist.is_initialized():  # vLLM's one-rank executor normally made a world of one already
        dist.init_process_group(
            "nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )
    new = build_tiny_model(tokenizer, seed=2).cuda()
    sharded = copy.deepcopy(new)
    mesh = init_device_mesh("cuda", (1,))
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    engine.push_weights(sharded)
    assert _mean_gap(_sample(engine, tokenizer, seed=3), new) < MATCH
    engine.push_weights(build_tiny_model(tokenizer, seed=0).cuda())


if __name__ == "__main__":  # one rank of test_two_ranks_push_from_fsdp2_shards_and_sample
    _rank_main(*sys.argv[1:])
