"""Loads saved checkpoints with ``load_sharded_causal_lm`` on however many ranks torchrun started
(or one plain process with ``--single``); rank 0 saves what the test compares. Run by
tests/distributed/test_sharded_load.py:

    # every parameter gathered whole, every rank's buffers and logits, the elements each rank read
    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/distributed/rank_sharded_load.py equal out.pt ckpt_a ckpt_b
    # peak RSS of the set-up (2 ranks; --single: one process, from_pretrained)
    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/distributed/rank_sharded_load.py rss out.pt ckpt
"""

import argparse
import json
import os
import resource
import threading
import time
from pathlib import Path

import torch

# imported before the baseline, as both paths use it
import transformers.models.qwen2.modeling_qwen2  # noqa: F401

from tests.distributed.ranks import READ, count_reads, leave
from vapo_lab.distributed.fsdp import full
from vapo_lab.distributed.world import World, single
from vapo_lab.models.sharded import load_sharded_causal_lm

IDS = torch.tensor([[1, 7, 42, 150, 151, 299, 3, 0], [5, 5, 300, 12, 64, 128, 255, 9]])

count_reads()  # READ: the elements this rank read from the files (its slices only)


def status_kib() -> dict[str, int]:
    """This process's resident set now, in KiB (/proc/self/status): VmRSS, and its anonymous
    (RssAnon: tensors, heap) and file-backed (RssFile: libraries, mmap'd safetensors) parts."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


class Sampler(threading.Thread):
    """Samples the largest RssAnon and RssFile every 2 ms (a lower bound on their peaks: ru_maxrss
    has only their sum's)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now = status_kib()
            for k in self.peak:
                self.peak[k] = max(self.peak[k], now[k])
            time.sleep(0.002)

    def stop(self) -> dict[str, int]:
        self.done.set()
        self.join()
        return self.peak


def equal(world: World, out: str, dirs: list[str]) -> None:
    results = {}
    for d in dirs:
        READ[0] = 0
        model = load_sharded_causal_lm(d, world, torch.device("cpu"), "float32")
        # collectives, in the same order on every rank
        params = {
            n: full(p.detach()).clone() for n, p in model.named_parameters(remove_duplicate=False)
        }
        local_dtypes = sorted({str(p.to_local().dtype) for p in model.parameters()})
        with torch.no_grad():
            logits = model(IDS).logits
        model.reshard()  # the root stays gathered after its forward (FSDP2's default)
        results[d] = {
            "params": params,
            "buffers": world.gather({n: b.clone() for n, b in model.named_buffers()}),
            "logits": world.gather(logits),
            "tied": model.lm_head.weight is model.model.embed_tokens.weight,
            "shard_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "local_dtypes": local_dtypes,
            "read": world.gather(READ[0]),
            "training": model.training,
        }
    if world.main:
        torch.save(results, out)


def rss(world: World, out: str, d: str) -> None:
    base, base_peak_kib = status_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sampler = Sampler()
    sampler.start()
    model = load_sharded_causal_lm(d, world, torch.device("cpu"), "float32")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    sampled, after = sampler.stop(), status_kib()
    # a check that the right weights came in: per-parameter float64 sums over all ranks
    local = {
        n: p.detach().to_local() if world.initialized else p.detach()
        for n, p in model.named_parameters()
    }
    sums = {n: world.sum(t.double().sum()) for n, t in local.items()}
    mine = {
        "rank": world.rank,
        "base_kib": base["VmRSS"],
        "base_peak_kib": base_peak_kib,
        "peak_kib": peak_kib,
        "after_kib": after["VmRSS"],
        "delta_kib": peak_kib - base["VmRSS"],
        "anon_delta_kib": sampled["RssAnon"] - base["RssAnon"],
        "file_delta_kib": sampled["RssFile"] - base["RssFile"],
        "read": READ[0],
        "params": sum(t.numel() for t in local.values()),
    }
    report = world.gather(mine)
    if world.main:
        torch.save({"ranks": report, "sums": {n: float(s) for n, s in sums.items()}}, out)
        print(json.dumps(report))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["equal", "rss"])
    ap.add_argument("out")
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--single", action="store_true", help="one plain process: from_pretrained")
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.single:
        world = single()
    else:
        torch.distributed.init_process_group("gloo")
        world = World(
            torch.distributed.get_rank(),
            torch.distributed.get_world_size(),
            int(os.environ["LOCAL_RANK"]),
            initialized=True,
        )
    if a.mode == "equal":
        equal(world, a.out, a.dirs)
    else:
        rss(world, a.out, a.dirs[0])
    if world.initialized:
        leave()


if __name__ == "__main__":
    main()
