"""One of two torchrun ranks (gloo) sharing one real vLLM engine of tensor_parallel_size=2 (its CPU
build, external_launcher): pushes from an FSDP2-sharded policy, samples in lockstep with uneven
shares, with a rank that has no prompts and with each rank's own n, then samples alone, which must
fail, not hang.

Usage: torchrun --nproc-per-node 2 rank_engine.py MODEL_DIR OUT_DIR; writes OUT_DIR/rank<r>.json.
"""

import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from vapo_lab.distributed.fsdp import shard
from vapo_lab.distributed.world import World
from vapo_lab.rollout.vllm_backend import EngineGroupError, VllmEngine

# token ids of three prompts of the tiny model (its vocabulary's digits and signs)
PROMPTS = [[2, 19, 13, 20, 31], [2, 21, 25, 13, 23, 31], [2, 22, 13, 22, 31]]


def _policy(path: str, zero: bool = False):
    """The model at ``path`` (all weights but the embeddings zeroed if ``zero``), FSDP2-sharded."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if zero:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "embed_tokens" not in name:
                    p.zero_()
    rank, size = dist.get_rank(), dist.get_world_size()
    return shard(copy.deepcopy(model), World(rank, size, rank, True), torch.device("cpu"))


def _rows(s) -> dict:
    return {
        "tokens": [s.response_ids[r, : int(s.lengths[r])].tolist() for r in range(len(s.lengths))],
        "logprobs": [s.logprobs[r, : int(s.lengths[r])].tolist() for r in range(len(s.lengths))],
        "prompts": [s.prompt_ids[r][s.prompt_mask[r]].tolist() for r in range(len(s.lengths))],
    }


def main() -> None:
    path, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    engine = VllmEngine(
        path,
        dtype="float32",
        seed=0,
        max_model_len=32,
        tensor_parallel_size=2,
        enforce_eager=True,
        dummy_weights=True,
        weight_bucket_mb=1,
        rank=rank,
        world_size=2,
        seed_per_request=True,
        lockstep_timeout_s=5,
    )
    mine = PROMPTS[:1] if rank == 0 else PROMPTS[1:]  # uneven shares
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = (tokenizer.eos_token_id, tokenizer.pad_token_id)
    result: dict = {}
    engine.push_weights(_policy(path, zero=True))
    zeroed = engine.sample(mine, 2, 6, 1.0, 1.0, *ids, 100 + 10 * rank)
    lp = zeroed.logprobs[zeroed.response_mask]
    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    result["zero_max_gap"] = float((lp + math.log(vocab)).abs().max())
    engine.push_weights(_policy(path))
    result["lockstep"] = _rows(engine.sample(mine, 2, 6, 1.0, 1.0, *ids, 100 + 10 * rank))
    # rank 0 has no prompts: it still runs the group's batch, and gets no rows back
    empty = engine.sample([] if rank == 0 else mine, 2, 6, 1.0, 1.0, *ids, 200 + 10 * rank)
    result["no_prompts"] = _rows(empty)
    # different n on the two ranks (an evaluation's shares): rank 0 one prompt x 3, rank 1 two x 1
    uneven = engine.sample(mine, 3 - 2 * rank, 6, 1.0, 1.0, *ids, 400 + 10 * rank)
    result["uneven_n"] = _rows(uneven)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    if rank == 1:  # not in any collective: rank 0 samples alone
        while not (out / "alone.json").exists():
            time.sleep(0.1)
    else:
        start = time.monotonic()
        try:
            engine.sample(mine, 2, 6, 1.0, 1.0, *ids, 300)
            alone = {"error": None}
        except EngineGroupError as e:
            alone = {"error": str(e), "seconds": time.monotonic() - start}
        (out / "alone.json").write_text(json.dumps(alone))
    os._exit(0)  # the group's gloo channel saw a timeout: leave without a teardown collective


if __name__ == "__main__":
    main()
