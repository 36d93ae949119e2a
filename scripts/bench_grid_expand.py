"""How long a grid's `--dry-run` takes at the cap (10,000 runs), against full composition per cell.

    python scripts/bench_grid_expand.py [--repeats 3] [--sample 60]

Prints, for each repeat, the end-to-end `vapo-lab sweep --dry-run` of a 10,000-run grid (2 cells x
1,000 learning rates x 5 seeds) and the per-cell time of a sample of its cells composed both ways,
interleaved (the reference: `compose_config` whole for each cell, as before issue 49); then the
medians and spreads, and the peak RSS. docs/benchmarks.md, "Grid expansion", has the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

GRID = """\
name: bench
seeds: [0, 1, 2, 3, 4]
sweep: {trainer.actor_lr: "range(1,1001)"}
cells:
  - {name: vapo, algo: vapo}
  - {name: dapo, algo: dapo}
"""


def dry_run(path: Path) -> tuple[float, int]:
    """Returns (seconds, lines printed) of `vapo-lab sweep PATH --dry-run`, in this process."""
    from typer.testing import CliRunner

    from vapo_lab.cli import app

    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        r = CliRunner().invoke(app, ["sweep", str(path), "--dry-run"])
    seconds = time.perf_counter() - t0
    assert r.exit_code == 0, r.output[-2000:]
    return seconds, r.output.count("would run")


def per_cell(path: Path, sample: int) -> tuple[float, float]:
    """Returns (seconds a cell by BatchComposer, seconds a cell by full composition) over ``sample``
    cells spread over the grid, the two interleaved cell by cell."""
    from vapo_lab.config.batch import BatchComposer
    from vapo_lab.config.compose import compose_config
    from vapo_lab.launch.grid import load_grid

    grid = load_grid(path)
    specs = grid.expand()
    picked = specs[:: max(1, len(specs) // sample)][:sample]
    composer = BatchComposer()
    composer.compose(picked[0].algo, picked[0].drop, picked[0].overrides)  # its structure: once
    fast = full = 0.0
    for s in picked:
        t0 = time.perf_counter()
        composer.compose(s.algo, s.drop, s.overrides)
        t1 = time.perf_counter()
        c = compose_config(algo=s.algo, drop=s.drop, overrides=s.overrides)
        OmegaConf.to_container(c.cfg, resolve=True)
        t2 = time.perf_counter()
        fast, full = fast + t1 - t0, full + t2 - t1
    return fast / len(picked), full / len(picked)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3g} (min {min(values):.3g}, max {max(values):.3g})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", type=int, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        path = Path(folder) / "bench.yaml"
        path.write_text(GRID)
        runs, ratios, fast_ms, full_ms = [], [], [], []
        for i in range(args.repeats):
            seconds, lines = dry_run(path)
            fast, full = per_cell(path, args.sample)
            runs.append(seconds)
            fast_ms.append(1000 * fast)
            full_ms.append(1000 * full)
            ratios.append(full / fast)
            print(
                f"repeat {i + 1}: dry run of {lines:,} runs {seconds:.1f} s; a cell "
                f"{1000 * fast:.2f} ms by value, {1000 * full:.0f} ms composed whole "
                f"({full / fast:.0f}x)",
                flush=True,
            )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"dry run of 10,000 runs, s: {spread(runs)}")
    print(f"a cell by value, ms: {spread(fast_ms)}; composed whole, ms: {spread(full_ms)}")
    print(
        f"whole / by value: {spread(ratios)}; at the reference's rate the dry run would take "
        f"{10_000 * statistics.median(full_ms) / 1000 / 60:.0f} min; peak RSS {rss:.0f} MiB"
    )


if __name__ == "__main__":
    main()
