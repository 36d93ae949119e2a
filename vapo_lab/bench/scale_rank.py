"""One rank of a `vapo-lab bench scale` run: trains a few steps; rank 0 writes their timings.

``python -m vapo_lab.bench.scale_rank --out FILE --warmup W --steps S [overrides...]`` runs alone
(trainer.strategy=single) or as one of the ranks torchrun starts (trainer.strategy=fsdp). It builds
the trainer's own :class:`~vapo_lab.trainer.trainer.Trainer` and calls ``train_step`` W + S + 1
times, each after a barrier:

* W warm-up steps, not reported (first-call allocations, lazy initialisation);
* S timed steps: rank 0's wall seconds around ``train_step``, the CPU seconds all ranks used
  meanwhile (``time.process_time``: every thread of the process) and the step's own metrics;
* one profiled step under ``torch.profiler`` on every rank (a profiler that slowed rank 0 alone
  would make the other rank wait, and rank 0 less): rank 0's trace gives the communication time
  (:func:`vapo_lab.bench.scale.comm_profile`).

No evaluation, no checkpoint: the loop's held-out evaluation and saves are not part of a step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()

# the step's metrics a record keeps (all reduced over ranks by the trainer)
KEPT = (
    "time/step_s",
    "time/rollout_s",
    "time/critic_s",
    "time/actor_s",
    "rollout/responses",
    "rollout/response_length",
)


def _step_record(wall: float, cpu: float, m: dict[str, float]) -> dict[str, Any]:
    """Returns one step's record: wall and all ranks' CPU seconds, phases, response tokens."""
    nan = float("nan")
    kept = {k.split("/")[1]: float(m.get(k, nan)) for k in KEPT}
    tokens = (
        round(kept["responses"] * kept["response_length"])
        if kept["responses"] == kept["responses"]
        else 0
    )
    return {"wall_s": wall, "cpu_s": cpu, **kept, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    """Runs one rank; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m vapo_lab.bench.scale_rank")
    parser.add_argument("--out", required=True, type=Path, help="rank 0's JSON record")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from vapo_lab.bench.scale import STEP_RECORD, comm_profile
    from vapo_lab.config.train import train_config
    from vapo_lab.trainer.trainer import Trainer

    cfg, choices = train_config(None, [], overrides)
    trainer = Trainer(cfg, choices, log=lambda text: None, command="vapo-lab bench scale")
    trainer.start()
    world = trainer.world
    setup_s = time.perf_counter() - STARTED
    warmup, timed, profiled = [], [], None
    try:
        for i in range(args.warmup + args.steps + 1):
            world.barrier()
            last = i == args.warmup + args.steps
            prof = profile(activities=[ProfilerActivity.CPU]) if last else contextlib.nullcontext()
            with prof:
                with record_function(STEP_RECORD) if last else contextlib.nullcontext():
                    t0, c0 = time.perf_counter(), time.process_time()
                    m = trainer.train_step()
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            record = _step_record(wall, float(world.sum(cpu)), m)
            if last:
                profiled = record
                if world.main:
                    profiled["comm"] = comm_profile(prof.events())
            else:
                (warmup if i < args.warmup else timed).append(record)
        world.barrier()
    except BaseException as e:
        trainer.record.close_on_error(e, trainer.step)
        raise
    else:
        trainer.record.close("FINISHED", trainer.step)
    finally:
        trainer.close()
    if world.main:
        args.out.write_text(
            json.dumps(
                {
                    "world_size": world.size,
                    "threads": torch.get_num_threads(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "setup_s": setup_s,
                    "warmup": warmup,
                    "steps": timed,
                    "profiled": profiled,
                    "peak_rss_mib": float(m.get("perf/peak_rss_mb", float("nan"))),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
