"""Benchmarks one training run on 1 and on 2 CPU ranks: tokens/s and the communication share.

Three variants of the same training (the embedded default, or it with overrides; one global
batch): ``single`` (one process, the reference), ``fsdp-1`` (FSDP2 and gloo on 1 rank under
torchrun) and ``fsdp-2`` (2 ranks, each sampling and training half the responses). Each runs as
its own processes (:mod:`vapo_lab.bench.scale_rank`) once a round, in rotating order so that the
machine's drift hits all three alike; the thread budget is divided among a variant's ranks.
Figures are medians over rounds with min-max, ratios taken round by round; what each means, and
what was measured: docs/benchmarks.md#scale-one-against-two-ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vapo_lab.errors import ConfigError, VapoLabError

# the record_function around the profiled step (scale_rank.py): communication is measured in it
STEP_RECORD = "bench::step"
# the spans gloo's worker threads open around each collective (ProcessGroupGloo's work titles)
GLOO_PREFIX = "gloo:"
# FSDP2's copies into / out of the flat collective buffers: memory copies beside the collectives
FSDP_COPIES = ("fsdp::all_gather_copy_in", "FSDP::all_gather_copy_out", "fsdp::chunk_cat")
# keys each variant sets itself: an override of one would make the variants the same run
OWNED_KEYS = (
    "trainer.strategy",
    "trainer.nproc_per_node",
    "trainer.nodes",
    "trainer.threads",
    "tracking",
    "output_dir",
    "resume",
)
# a run's wall-clock limit (setup, which may build the caches, and its steps)
RUN_TIMEOUT_S = 3600


class ScaleBenchError(VapoLabError):
    """A benchmark run failed, or the benchmark was asked for something it cannot do."""


@dataclass(frozen=True)
class Variant:
    """One way of running the same training: ``strategy`` on ``nproc`` ranks."""

    name: str
    strategy: str
    nproc: int


VARIANTS = (
    Variant("single", "single", 1),
    Variant("fsdp-1", "fsdp", 1),
    Variant("fsdp-2", "fsdp", 2),
)
# (numerator, denominator) of the ratios printed, and what each says
RATIOS = (
    ("fsdp-2", "fsdp-1", "2 ranks / 1 rank, both fsdp"),
    ("fsdp-2", "single", "2 ranks (fsdp) / 1 process (single)"),
    ("fsdp-1", "single", "fsdp on 1 rank / single: FSDP2's own cost"),
)


@dataclass(frozen=True)
class Spread:
    """The median of some values and their range."""

    median: float
    low: float
    high: float
    n: int


def spread(values: Iterable[float]) -> Spread:
    """Returns the median, min and max of ``values`` (NaN ones dropped; all NaN for none left)."""
    kept = [float(v) for v in values if v == v]
    if not kept:
        nan = float("nan")
        return Spread(nan, nan, nan, 0)
    return Spread(statistics.median(kept), min(kept), max(kept), len(kept))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Returns the total length covered by the ``(start, end)`` intervals, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def comm_summary(spans: Iterable[tuple[str, int | None, float, float]]) -> dict[str, Any]:
    """Returns the communication of one profiled step from its profiler spans.

    Args:
        spans: (name, thread, start, end) of every profiler event, times in microseconds. The step
            is the span named ``STEP_RECORD`` (the first, if more); communication the spans whose
            name starts with ``gloo:``, clipped to the step; ``c10d::*`` spans count the collectives
            issued; FSDP_COPIES spans are FSDP's buffer copies.

    Returns:
        {"step_s": the step's span, "comm_s": the union of the clipped gloo spans, "share":
        comm_s / step_s, "ops": {gloo op: {"count", "seconds" (sum of spans, overlaps counted
        each)}}, "calls": {c10d op: count}, "fsdp_copy_s": sum of FSDP's copy spans}; seconds.

    Raises:
        ValueError: no span named STEP_RECORD.
    """
    spans = list(spans)
    window = next(((s, e) for name, _, s, e in spans if name == STEP_RECORD), None)
    if window is None:
        raise ValueError(f"no {STEP_RECORD!r} span in the profile: the step was not recorded")
    lo, hi = window
    comm: list[tuple[float, float]] = []
    ops: dict[str, dict[str, float]] = {}
    calls: dict[str, int] = {}
    copies = 0.0
    for name, _, start, end in spans:
        start, end = max(start, lo), min(end, hi)
        if end <= start:
            continue
        if name.startswith(GLOO_PREFIX):
            comm.append((start, end))
            op = ops.setdefault(name[len(GLOO_PREFIX) :], {"count": 0, "seconds": 0.0})
            op["count"] += 1
            op["seconds"] += (end - start) / 1e6
        elif name.startswith("c10d::"):
            calls[name] = calls.get(name, 0) + 1
        elif name.startswith(FSDP_COPIES):
            copies += end - start
    step_s, comm_s = (hi - lo) / 1e6, union_length(comm) / 1e6
    return {
        "step_s": step_s,
        "comm_s": comm_s,
        "share": comm_s / step_s if step_s > 0 else float("nan"),
        "ops": dict(sorted(ops.items())),
        "calls": dict(sorted(calls.items())),
        "fsdp_copy_s": copies / 1e6,
    }


def comm_profile(events: Iterable[Any]) -> dict[str, Any]:
    """Returns :func:`comm_summary` of torch.profiler ``FunctionEvent`` s (``prof.events()``)."""
    return comm_summary((e.name, e.thread, e.time_range.start, e.time_range.end) for e in events)


def run_figures(record: dict[str, Any]) -> dict[str, float]:
    """Returns the figures of one run (one variant in one round) from its rank-0 record.

    tokens_per_s: the timed steps' response tokens over their wall seconds; cpu_use: all ranks'
    CPU seconds over those wall seconds (below the thread budget where other processes took the
    CPUs, or threads waited); step_s, wall_s and the phases (rollout_s, prep_s, critic_s, actor_s):
    medians over the timed steps; comm_share, comm_s, fsdp_copy_s, profiled_step_s: of the profiled
    step.
    """
    steps = record["steps"]
    wall = sum(s["wall_s"] for s in steps)
    figures = {
        "tokens_per_s": sum(s["tokens"] for s in steps) / wall if wall > 0 else float("nan"),
        "tokens_per_step": statistics.median(s["tokens"] for s in steps),
        "wall_s": statistics.median(s["wall_s"] for s in steps),
        "cpu_use": sum(s["cpu_s"] for s in steps) / wall if wall > 0 else float("nan"),
    }
    for key in ("step_s", "rollout_s", "critic_s", "actor_s"):
        figures[key] = statistics.median(s[key] for s in steps)
    figures["prep_s"] = statistics.median(
        s["step_s"] - s["rollout_s"] - s["critic_s"] - s["actor_s"] for s in steps
    )
    comm = (record.get("profiled") or {}).get("comm")
    nan = float("nan")
    figures.update(
        {
            "comm_share": comm["share"],
            "comm_s": comm["comm_s"],
            "fsdp_copy_s": comm["fsdp_copy_s"],
            "profiled_step_s": comm["step_s"],
        }
        if comm
        else {"comm_share": nan, "comm_s": nan, "fsdp_copy_s": nan, "profiled_step_s": nan}
    )
    return figures


# figures summarised per variant, and the two ratios taken round by round
FIGURES = (
    "tokens_per_s",
    "tokens_per_step",
    "wall_s",
    "cpu_use",
    "step_s",
    "rollout_s",
    "prep_s",
    "critic_s",
    "actor_s",
    "comm_share",
    "comm_s",
    "fsdp_copy_s",
    "profiled_step_s",
)


def summarize(rounds: Sequence[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Returns the benchmark's summary from each round's figures.

    Args:
        rounds: one dict per round, {variant name: :func:`run_figures` of its run}.

    Returns:
        {"variants": {name: {figure: Spread over rounds}}, "ratios": [{"num", "den", "what",
        "tokens_per_s": Spread of num/den, "wall_s": Spread of num/den}]}: ratios of the same
        round's runs, for the RATIOS whose two variants ran.
    """
    names = [v.name for v in VARIANTS if any(v.name in r for r in rounds)]
    variants = {n: {f: spread(r[n][f] for r in rounds if n in r) for f in FIGURES} for n in names}
    ratios = []
    for num, den, what in RATIOS:
        paired = [r for r in rounds if num in r and den in r]
        if paired:
            ratios.append(
                {
                    "num": num,
                    "den": den,
                    "what": what,
                    **{
                        f: spread(r[num][f] / r[den][f] for r in paired)
                        for f in ("tokens_per_s", "wall_s")
                    },
                }
            )
    return {"variants": variants, "ratios": ratios}


def check_overrides(overrides: Sequence[str]) -> None:
    """Raises ConfigError for an override of a key the variants set themselves (OWNED_KEYS)."""
    bad = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] in OWNED_KEYS]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: the benchmark sets {', '.join(OWNED_KEYS)} itself for each "
            "variant; drop the override (the thread budget is --threads)"
        )


def available_cpus() -> int:
    """Returns the number of CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_command(
    variant: Variant,
    out: Path,
    warmup: int,
    steps: int,
    overrides: Sequence[str],
    threads: int,
    output_dir: Path,
) -> list[str]:
    """Returns the command line of one run of ``variant``: the rank module, or it under torchrun."""
    module = [
        "-m",
        "vapo_lab.bench.scale_rank",
        f"--out={out}",
        f"--warmup={warmup}",
        f"--steps={steps}",
        f"trainer.strategy={variant.strategy}",
        f"trainer.nproc_per_node={variant.nproc}",
        f"trainer.threads={threads}",
        "tracking=none",
        f"output_dir={output_dir}",
        *overrides,
    ]
    if variant.strategy == "single":
        return [sys.executable, *module]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(variant.nproc),
        *module,
    ]


def _run_variant(
    variant: Variant,
    workdir: Path,
    tag: str,
    warmup: int,
    steps: int,
    overrides: Sequence[str],
    threads: int,
) -> dict[str, Any]:
    """Runs ``variant`` once; returns rank 0's record (ScaleBenchError with its log's tail)."""
    out, log = workdir / f"{tag}.json", workdir / f"{tag}.log"
    per_rank = max(1, threads // variant.nproc)
    command = rank_command(
        variant, out, warmup, steps, overrides, per_rank, workdir / f"{tag}-runs"
    )
    # torchrun sets OMP_NUM_THREADS=1 where it is unset; the rank's trainer.threads sets torch's too
    env = {**os.environ, "OMP_NUM_THREADS": str(per_rank)}
    start = time.perf_counter()
    with open(log, "w") as f:
        try:
            done = subprocess.run(
                command, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=RUN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ScaleBenchError(
                f"{variant.name} did not finish in {RUN_TIMEOUT_S} s; its output: {log}"
            ) from None
    if done.returncode != 0 or not out.is_file():
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error:" in line]
        last = (errors or lines or ["(no output)"])[-1].strip()
        raise ScaleBenchError(
            f"{variant.name} run failed (exit status {done.returncode}): {last[:300]}; "
            f"its whole output: {log}"
        )
    record = json.loads(out.read_text())
    record["run_s"] = time.perf_counter() - start
    shutil.rmtree(workdir / f"{tag}-runs", ignore_errors=True)
    return record


def run_scale_benchmark(
    rounds: int = 5,
    steps: int = 4,
    warmup: int = 1,
    threads: int | None = None,
    overrides: Sequence[str] = (),
    variants: Sequence[Variant] = VARIANTS,
    log: Callable[[str], None] = lambda text: None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Runs every variant once a round for ``rounds`` rounds, interleaved; returns the measurements.

    Args:
        steps: timed steps per run, after ``warmup`` untimed ones; one profiled step follows.
        threads: CPU threads per variant, divided among its ranks; None: every CPU available.
        overrides: Hydra overrides of the embedded default, except OWNED_KEYS.
        on_run: called after every run with the result so far (``"complete": False`` until the
            last), e.g. to keep a record of a benchmark that is stopped.

    Returns:
        {"rounds", "steps", "warmup", "threads", "cpus", "overrides", "complete", "load": 1-minute
        load averages (before the first run, after each run), "runs": [{variant name: rank-0
        record}] one per round begun, "figures": [{variant name: run_figures}] likewise,
        "summary": :func:`summarize`}.

    Raises:
        ConfigError: a count below its minimum, or an override of a key the benchmark sets.
        ScaleBenchError: a run failed (its error line and the path of its whole output; the
            working folder is kept).
    """
    if rounds < 1 or steps < 1 or warmup < 0 or (threads is not None and threads < 1):
        raise ConfigError(
            f"--rounds {rounds} / --steps {steps} / --warmup {warmup} / --threads {threads}: need "
            "rounds >= 1, steps >= 1, warmup >= 0 and threads >= 1"
        )
    check_overrides(overrides)
    cpus = available_cpus()
    threads = threads or cpus
    workdir = Path(tempfile.mkdtemp(prefix="vapo-bench-scale-"))
    runs: list[dict[str, Any]] = []
    figures: list[dict[str, dict[str, float]]] = []
    load = [os.getloadavg()[0]]

    def result(complete: bool) -> dict[str, Any]:
        return {
            "rounds": rounds,
            "steps": steps,
            "warmup": warmup,
            "threads": threads,
            "cpus": cpus,
            "overrides": list(overrides),
            "complete": complete,
            "load": list(load),
            "runs": runs,
            "figures": figures,
            "summary": summarize(figures),
        }

    ok = False
    try:
        for r in range(rounds):
            order = list(variants[r % len(variants) :]) + list(variants[: r % len(variants)])
            runs.append({})
            figures.append({})
            for v in order:
                record = _run_variant(
                    v, workdir, f"round{r + 1}-{v.name}", warmup, steps, overrides, threads
                )
                runs[-1][v.name] = record
                figures[-1][v.name] = f = run_figures(record)
                load.append(os.getloadavg()[0])
                log(
                    f"round {r + 1}/{rounds} {v.name}: {f['tokens_per_s']:.0f} tokens/s, "
                    f"{f['wall_s']:.2f} s/step, communication {100 * f['comm_share']:.0f}%, "
                    f"{f['cpu_use']:.2f} CPUs busy (run {record['run_s']:.0f} s, "
                    f"load {load[-1]:.1f})"
                )
                if on_run is not None:
                    on_run(result(False))
        ok = True
    finally:
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
    return result(True)


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    """Returns ``result`` with its Spreads as plain dicts (for ``--out``)."""

    def plain(x: Any) -> Any:
        if isinstance(x, Spread):
            return asdict(x)
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list):
            return [plain(v) for v in x]
        return x

    return plain(result)


def _cell(s: Spread, fmt: str, scale: float = 1.0) -> str:
    return (
        f"{format(s.median * scale, fmt)} "
        f"[{format(s.low * scale, fmt)}-{format(s.high * scale, fmt)}]"
    )


def format_scale_benchmark(result: dict[str, Any]) -> str:
    """Returns :func:`run_scale_benchmark`'s report: settings, a line per variant, the ratios."""
    summary = result["summary"]
    load, nan = result["load"], float("nan")
    lines = [
        f"One training on 1 and 2 CPU ranks (gloo): {result['rounds']} rounds, each variant once "
        f"a round in rotating order; {result['steps']} timed steps a run after "
        f"{result['warmup']} warm-up, then 1 profiled",
        f"overrides: {' '.join(result['overrides']) or '(none: the embedded default)'}",
        f"{result['threads']} thread{'s' if result['threads'] != 1 else ''} a variant, split "
        f"among its ranks (at least 1 each); {result['cpus']} CPUs; 1-min load average "
        f"{load[0]:.1f} before, "
        f"{min(load[1:], default=nan):.1f}-{max(load[1:], default=nan):.1f} after the runs "
        "(this benchmark alone adds about 1-2)",
        "",
        f"{'variant':<8} {'ranks':>5} {'tokens/s':>17} {'s/step':>17} {'rollout':>7} "
        f"{'prep':>5} {'critic':>6} "
        f"{'actor':>5} {'comm share':>17} {'comm s':>6} {'CPUs busy':>9}",
    ]
    per_rank = {v.name: f"{v.nproc}x{max(1, result['threads'] // v.nproc)}" for v in VARIANTS}
    for name, f in summary["variants"].items():
        lines.append(
            f"{name:<8} {per_rank.get(name, '?'):>5} {_cell(f['tokens_per_s'], '.0f'):>17} "
            f"{_cell(f['wall_s'], '.2f'):>17} {f['rollout_s'].median:>7.2f} "
            f"{f['prep_s'].median:>5.2f} "
            f"{f['critic_s'].median:>6.2f} {f['actor_s'].median:>5.2f} "
            f"{_cell(f['comm_share'], '.1f', 100) + '%':>17} {f['comm_s'].median:>6.2f} "
            f"{f['cpu_use'].median:>9.2f}"
        )
    lines += ["", "ratios, round by round (median [min-max]):"]
    for ratio in summary["ratios"]:
        lines.append(
            f"  {ratio['num']} / {ratio['den']}: tokens/s {_cell(ratio['tokens_per_s'], '.2f')}x, "
            f"s/step {_cell(ratio['wall_s'], '.2f')}x  ({ratio['what']})"
        )
    profiled = [
        f"{n} {f['profiled_step_s'].median:.2f} s vs {f['wall_s'].median:.2f} s"
        for n, f in summary["variants"].items()
    ]
    lines += [
        "",
        "tokens/s: response tokens of the step over all ranks per wall second of the step "
        "(rank 0); s/step: wall seconds; phases: the trainer's time/* medians (prep: "
        "value/reference passes and advantages); ranks: ranks x threads each; CPUs busy: CPU "
        "seconds of all ranks per wall second.",
        "comm share: of the profiled step, the time rank 0 had a gloo collective running (FSDP "
        "all-gathers and reduce-scatters, the trainer's all-reduces and gathers, DTensor "
        "gathers), waits for the other rank included. Profiled step vs timed s/step: "
        + "; ".join(profiled)
        + ".",
    ]
    extra = (
        "collectives and work that does not halve with the batch (sampling decodes to each "
        "rank's longest response; each rank refreshes its sampler's full copy of the weights)"
    )
    if result["cpus"] <= 2 and result["threads"] >= 2:
        lines.append(
            f"On {result['cpus']} cores no speed-up is expected: the 2 ranks share the cores "
            f"that 1 process uses with {result['threads']} threads, and add {extra}."
        )
    elif result["cpus"] <= 2:
        lines.append(
            f"On {result['cpus']} cores no speed-up is expected: fsdp-2 has 2 threads to the "
            "others' 1, but a second core only where nothing else runs (CPUs busy says how much "
            f"it got), and it adds {extra}; a rank waiting for the other one's time slice counts "
            "as communication."
        )
    return "\n".join(lines)
