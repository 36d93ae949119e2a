"""The trainer's held-out evaluation on N CPU ranks: the samples each rank draws and the wall time.

    python scripts/bench_eval_spread.py --ranks 2 --problems 3 --samples 64 [--repeats 3]

Starts N gloo ranks with torchrun (N = 1: one process, trainer.strategy=single), each building the
embedded default's parts (its shipped base model, one thread a rank; the first --problems of
task=arith's held-out problems, rollout.eval_samples=--samples) and calling
``vapo_lab.trainer.evaluation.evaluate`` --repeats times, each after a barrier, with the seed of
the evaluation at step 0. Every rank records the prompts and rows its ``generate`` call got, its
seconds in that call and the evaluation's wall seconds; the script prints them and the metrics (the
same on every rank). docs/benchmarks.md, "Evaluation over the ranks", has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rank_main(args: argparse.Namespace) -> None:
    """One rank: build the parts, evaluate --repeats times, write OUT/rank<r>.json."""
    import torch

    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed
    from vapo_lab.seeds import heldout_seed
    from vapo_lab.trainer.evaluation import evaluate
    from vapo_lab.trainer.setup import build_parts

    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    # no step runs: the step's prompts (group_size 8 each) need only divide among the ranks
    strategy = [
        "trainer.strategy=fsdp",
        f"trainer.nproc_per_node={ranks}",
        f"rollout.responses_per_step={8 * ranks}",
        f"trainer.mini_batch_size={8 * ranks}",
    ]
    strategy = strategy if ranks > 1 else []
    composed = compose_config(
        overrides=[
            "tracking=none",
            f"rollout.eval_samples={args.samples}",
            "trainer.threads=1",
            "trainer.device=cpu",
            *strategy,
        ]
    )
    config = typed(composed.cfg)
    parts = build_parts(config, log=lambda text: None)
    # not task.n_eval: the base model is keyed by the splits, and the shipped one is n_eval 256's
    parts.task.eval = list(parts.task.eval)[: args.problems]
    calls: list[dict[str, float]] = []

    def generate(prompts, n, temperature, top_p, generator):
        t0 = time.perf_counter()
        s = parts.sampling.generate(prompts, n, temperature, top_p, generator)
        seconds = time.perf_counter() - t0
        calls.append({"prompts": len(prompts), "n": n, "rows": len(prompts) * n, "s": seconds})
        return s

    runs = []
    for _ in range(args.repeats):
        calls.clear()
        if parts.world.initialized:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        metrics = evaluate(
            generate,
            parts.tokenizer,
            parts.task,
            parts.scorer,
            config.rollout,
            config.model.chat_template,
            heldout_seed(config.seed, 0),
            parts.world,
        )
        runs.append({"wall_s": time.perf_counter() - t0, "calls": list(calls), "metrics": metrics})
    (Path(args.out) / f"rank{parts.world.rank}.json").write_text(json.dumps(runs))
    if parts.world.initialized:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--problems", type=int, default=3, help="the first this many held-out problems")
    ap.add_argument("--samples", type=int, default=64, help="rollout.eval_samples")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="(a rank's) folder for the rank records")
    ap.add_argument("--rank", action="store_true", help="run as one rank (torchrun starts these)")
    args = ap.parse_args()
    if args.rank:
        rank_main(args)
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="eval-spread-"))
    out.mkdir(parents=True, exist_ok=True)
    own = [
        __file__,
        "--rank",
        f"--out={out}",
        f"--problems={args.problems}",
        f"--samples={args.samples}",
        f"--repeats={args.repeats}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if args.ranks == 1:
        command = [sys.executable, *own]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.ranks}",
            *own,
        ]
    subprocess.run(command, check=True, env=env)  # caches: in the working directory
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    load = os.getloadavg()[0]
    print(
        f"{args.problems} problems x {args.samples} samples on {args.ranks} rank(s), "
        f"{args.repeats} repeat(s); 1-min load after: {load:.2f}"
    )
    for r, runs in enumerate(records):
        c = runs[0]["calls"]
        gen_s = [sum(x["s"] for x in run["calls"]) for run in runs]
        rows = sum(x["rows"] for x in c)
        print(
            f"  rank {r}: generate calls {[(x['prompts'], x['n']) for x in c]} = {rows} samples; "
            f"generate s median {statistics.median(gen_s):.2f} [{min(gen_s):.2f}-{max(gen_s):.2f}]"
        )
    walls = [max(runs[i]["wall_s"] for runs in records) for i in range(args.repeats)]
    print(
        f"  evaluation wall s (slowest rank) median {statistics.median(walls):.2f} "
        f"[{min(walls):.2f}-{max(walls):.2f}]"
    )
    print(f"  metrics (rank 0, first repeat): {json.dumps(records[0][0]['metrics'])}")
    same = all(runs[0]["metrics"] == records[0][0]["metrics"] for runs in records)
    print(f"  every rank got the same metrics: {same}")


if __name__ == "__main__":
    main()
