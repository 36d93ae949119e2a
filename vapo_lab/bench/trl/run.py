"""The benchmark's driver: builds the model, runs every side's worker interleaved, compares.

The workers are :mod:`.ours` and :mod:`.theirs`, started as processes (:mod:`.protocol`); this
module runs in the main env.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vapo_lab.bench.trl.envs import ENVS, check_trl_python, default_python, setup_command
from vapo_lab.bench.trl.protocol import WorkerProcess, worker_argv, worker_env
from vapo_lab.bench.trl.spec import BenchSpec, TrlBenchError
from vapo_lab.models.tiny import build_tiny_model
from vapo_lab.models.tokenizer import build_tokenizer
from vapo_lab.tasks.arith import ArithTask


def build_bench_model(path: str | Path, seed: int = 0) -> int:
    """Saves the tiny policy and its tokenizer to ``path``; returns the policy's parameter count.

    The tokenizer covers the embedded task's whole vocabulary (1..40 digits, 2827 tokens), as the
    default model's does, so the model has the default size (~1.1M parameters) whatever
    ``BenchSpec.digits`` is.
    """
    tokenizer = build_tokenizer(ArithTask(seed=0, n_train=0, n_eval=0).vocabulary())
    model = build_tiny_model(tokenizer, seed=seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


@dataclass
class SideResult:
    """Timings of one side: per-step seconds and generated tokens, and what the worker reported."""

    name: str
    info: dict[str, Any] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rss_mib: float = 0.0

    @property
    def s_per_step(self) -> float:
        return sum(self.seconds) / len(self.seconds)

    @property
    def median_s_per_step(self) -> float:
        ordered = sorted(self.seconds)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    @property
    def tokens_per_step(self) -> float:
        return sum(self.tokens) / len(self.tokens)


# side name -> (part, worker kind: ours-<algo> runs in the main env, trl-* in the part's TRL env;
# the -nogc kind has the trainer's per-step gc.collect() calls disabled, theirs.disable_gc_collect)
SIDES = {
    "vapo-lab PPO": ("ppo", "ours-ppo"),
    "vapo-lab VAPO": ("ppo", "ours-vapo"),
    "TRL PPOTrainer": ("ppo", "trl-ppo"),
    "TRL PPOTrainer no-gc": ("ppo", "trl-ppo-nogc"),
    "vapo-lab GRPO": ("grpo", "ours-grpo"),
    "TRL GRPOTrainer": ("grpo", "trl-grpo"),
}
# The groups of comparisons, in the order printed; the first is the headline (judged on the
# target). GRPOTrainer calls no gc.collect() (its worker counts the calls in its module), so it is
# the same side in the first two groups.
SAME_WORK = "same work (headline): TRL with its per-step gc.collect() disabled"
AS_SHIPPED = "same work, TRL as shipped (PPOTrainer's two gc.collect() per step included)"
DIFFERENT_WORK = "different work, not a headline (VAPO: no reference model, one prefill per prompt)"
# (group, label, TRL side, our side)
COMPARISONS = [
    (SAME_WORK, "PPO", "TRL PPOTrainer no-gc", "vapo-lab PPO"),
    (SAME_WORK, "GRPO", "TRL GRPOTrainer", "vapo-lab GRPO"),
    (AS_SHIPPED, "PPO", "TRL PPOTrainer", "vapo-lab PPO"),
    (AS_SHIPPED, "GRPO", "TRL GRPOTrainer", "vapo-lab GRPO"),
    (DIFFERENT_WORK, "VAPO", "TRL PPOTrainer no-gc", "vapo-lab VAPO"),
    (DIFFERENT_WORK, "VAPO", "TRL PPOTrainer", "vapo-lab VAPO"),
]


def run_trl_benchmark(
    steps: int = 8,
    warmup: int = 1,
    parts: Sequence[str] = ("ppo", "grpo"),
    trl_python: str | Path | None = None,
    trl_grpo_python: str | Path | None = None,
    spec: BenchSpec = BenchSpec(),
    log: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Runs every side of ``parts`` for ``steps`` timed steps each, interleaved step by step.

    Args:
        warmup: untimed steps per side first (allocator, first-call overheads).
        parts: "ppo" (vapo-lab PPO and VAPO vs TRL PPOTrainer) and/or "grpo".
        trl_python: interpreter of the trl==1.12.0 env (default .bench-venv/trl112/bin/python).
        trl_grpo_python: interpreter of the latest-TRL env (default: under .bench-venv/trl-latest).

    Returns:
        {"spec", "model_params", "steps", "warmup", "sides": {name: SideResult},
        "load": (1-minute load average before the warm-up, after the last step)}.

    Raises:
        VapoLabError: a TRL env is missing (one line naming the setup command) or a worker failed.
    """
    parts = list(dict.fromkeys(parts))
    for part in parts:
        if part not in ENVS:
            raise TrlBenchError(f"--part {part!r} is not a comparison: choose ppo or grpo")
    if steps < 1 or warmup < 0 or spec.threads < 1:
        raise TrlBenchError(
            f"--steps {steps} / --warmup {warmup} / --threads {spec.threads}: "
            "need steps >= 1, warmup >= 0 and threads >= 1"
        )
    pythons = {
        "ppo": trl_python or default_python("ppo"),
        "grpo": trl_grpo_python or default_python("grpo"),
    }
    for part in parts:
        pythons[part] = check_trl_python(part, pythons[part])

    workdir = Path(tempfile.mkdtemp(prefix="vapo-bench-trl-"))
    workers: dict[str, WorkerProcess] = {}
    ok = False
    try:
        model_dir = workdir / "model"
        params = build_bench_model(model_dir, seed=spec.seed)
        env = worker_env(spec)
        names = [n for n, (part, _) in SIDES.items() if part in parts]
        results = {n: SideResult(n) for n in names}
        for name in names:  # start all, then wait: their set-ups overlap
            part, kind = SIDES[name]
            ours = kind.startswith("ours-")
            python = sys.executable if ours else pythons[part]
            (workdir / kind).mkdir()
            hint = (
                ""
                if ours
                else f"; if the TRL env is incomplete, recreate it: {setup_command(part)}"
            )
            workers[name] = WorkerProcess(
                name,
                worker_argv(python, kind, model_dir, spec, workdir / kind),
                workdir / f"{kind}.log",
                env,
                hint,
            )
        for name in names:
            message = workers[name].recv()
            results[name].info = message
            log(f"{name}: ready")
        load_before = os.getloadavg()[0]
        for name in names:  # warm-up, untimed
            if warmup:
                workers[name].send(cmd="run", steps=warmup)
                workers[name].recv()
        for i in range(steps):
            order = names[i % len(names) :] + names[: i % len(names)]  # rotate who goes first
            for name in order:
                workers[name].send(cmd="run", steps=1)
                message = workers[name].recv()
                results[name].seconds += message["seconds"]
                results[name].tokens += message["tokens"]
                results[name].rss_mib = message["rss_mib"]
            log(
                f"step {i + 1}/{steps}: "
                + ", ".join(f"{n} {results[n].seconds[-1]:.2f}s" for n in names)
            )
        ok = True
        return {
            "spec": spec,
            "model_params": params,
            "steps": steps,
            "warmup": warmup,
            "sides": results,
            "load": (load_before, os.getloadavg()[0]),
        }
    finally:
        for worker in workers.values():
            worker.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)


def format_trl_benchmark(result: dict[str, Any]) -> str:
    """Returns ``run_trl_benchmark``'s report: one table, the ratios and what differs."""
    spec: BenchSpec = result["spec"]
    sides: dict[str, SideResult] = result["sides"]
    any_side = next(iter(sides.values()))
    versions = sorted(
        {f"trl {s.info['trl']} ({s.name})" for s in sides.values() if "trl" in s.info}
    )
    lines = [
        f"vapo-lab vs TRL, one RL step on CPU: tiny Qwen2 policy of "
        f"{result['model_params'] / 1e6:.2f}M parameters, "
        f"fp32, {spec.threads} threads, torch {any_side.info.get('torch', '?')}",
        f"{spec.completions} completions x <= {spec.max_new_tokens} new tokens (stop at eos), "
        f"{spec.epochs} epoch of {spec.completions // spec.mini_batch_size} optimiser steps "
        f"x {spec.mini_batch_size}, "
        f"arith prompts of {2 * spec.digits + 2} tokens, verifier reward; "
        f"{result['steps']} timed steps per side after {result['warmup']} warm-up, "
        "interleaved step by step",
        "; ".join(versions)
        + (
            f"; 1-min load average {result['load'][0]:.1f} before, {result['load'][1]:.1f} after "
            f"on {os.cpu_count()} CPUs (the benchmark alone adds about {spec.threads})"
            if "load" in result
            else ""
        ),
        "",
        f"{'side':<22} {'s/step':>7} {'median':>7} {'gen tok/step':>13} {'gen tok/s':>10} "
        f"{'peak RSS':>10}",
    ]
    for s in sides.values():
        lines.append(
            f"{s.name:<22} {s.s_per_step:>7.2f} {s.median_s_per_step:>7.2f} "
            f"{s.tokens_per_step:>13.0f} "
            f"{s.tokens_per_s:>10.0f} {s.rss_mib:>6.0f} MiB"
        )
    rows = compare(sides)
    for group in dict.fromkeys(row["group"] for row in rows):
        target = "  target >= 2x" if group == SAME_WORK else ""
        lines += [
            "",
            group + ":",
            f"  {'comparison':<38} {'s/step ratio':>12} {'median':>7} {'tok/s ratio':>12}{target}",
        ]
        for row in (r for r in rows if r["group"] == group):
            verdict = (
                ("  met" if min(row["speedup"], row["tokens_ratio"]) >= 2 else "  NOT met")
                if target
                else ""
            )
            lines.append(
                f"  {row['ours'] + ' vs ' + row['theirs']:<38} {row['speedup']:>11.2f}x "
                f"{row['median_speedup']:>6.2f}x {row['tokens_ratio']:>11.2f}x{verdict}"
            )
    lines += [
        "",
        "s/step: mean over the timed steps; ratios: TRL s/step / vapo-lab s/step "
        "(mean, and of the medians)",
        "and vapo-lab tok/s / TRL tok/s, above 1 where vapo-lab is faster; "
        "the target is judged on the means",
        "of the same-work comparisons.",
        "gen tok/s = generated tokens (eos included) / whole-step seconds "
        "(rollout + grading + updates).",
        "What differs:",
    ]
    lines += [f"- {note}" for note in _differences(sides)]
    return "\n".join(lines)


def compare(sides: dict[str, SideResult]) -> list[dict[str, Any]]:
    """Returns one row per comparison present: its group, our side, TRL's, and the two ratios.

    ``speedup`` is TRL's mean s/step over ours (``median_speedup``: of the medians),
    ``tokens_ratio`` our generated tokens/s over TRL's; above 1 vapo-lab is faster.
    """
    rows = []
    for group, label, theirs, ours in COMPARISONS:
        if theirs in sides and ours in sides:
            a, b = sides[theirs], sides[ours]
            rows.append(
                {
                    "group": group,
                    "label": label,
                    "ours": ours,
                    "theirs": theirs,
                    "speedup": a.s_per_step / b.s_per_step,
                    "median_speedup": a.median_s_per_step / b.median_s_per_step,
                    "tokens_ratio": b.tokens_per_s / a.tokens_per_s,
                }
            )
    return rows


def _differences(sides: dict[str, SideResult]) -> list[str]:
    """Returns the printed notes on where the two sides' work is not the same."""
    notes = []
    for s in sides.values():
        if "gc_calls" in s.info:
            what = (
                "replaced by no-ops in this side "
                "(the module's own `gc` global; nothing else changed)"
                if s.info["gc_off"]
                else "run as shipped"
            )
            notes.append(
                f"{s.name}: its trainer module ({s.info['trainer_module']}) "
                f"has {s.info['gc_calls']} gc.collect() call(s), {what}"
                if s.info["gc_calls"]
                else f"{s.name}: its trainer module ({s.info['trainer_module']}) "
                "calls no gc.collect()"
            )
    if "TRL PPOTrainer" in sides or "TRL PPOTrainer no-gc" in sides:
        notes += [
            "PPO: TRL updates policy and value model with one optimiser on pg_loss + 0.1 * vf_loss "
            "(one backward through both); vapo-lab runs separate critic and actor updates (two "
            "optimisers, two backwards): the same forward/backward work, plus vapo-lab's grad "
            "clipping (TRL's PPO loop clips nothing).",
            "PPO: both run a frozen reference model for the KL penalty in the reward (k1, 0.05, "
            "TRL's default). VAPO has no KL term, so vapo-lab VAPO runs no reference model while "
            "TRL's PPOTrainer always does: that forward pass is skipped on our side.",
            "VAPO samples 8 prompts x 8 (its group sampling) and prefills each prompt once; TRL's "
            "PPOTrainer has one sample per prompt (64 prompts, 64 prefills). VAPO's critic starts "
            "from the policy, with no reward model or value pretraining (one-off phases before "
            "step 1).",
            "PPO: TRL's rollout keeps the logits of every generated token (output_scores) and runs "
            "the value model over the whole sequence; vapo-lab's sampler returns log-probs and its "
            "training passes apply the LM head to response positions only.",
        ]
    if "TRL GRPOTrainer" in sides:
        notes += [
            "GRPO: TRL recomputes the old log-probs with an extra forward pass (its 4 optimiser "
            "steps per generation make the policy stale); vapo-lab uses the sampler's log-probs, "
            "computed by the same fp32 model at sampling time. Both run the reference model (k3 KL "
            "in the loss, beta 0.04). TRL computes log-probs with its chunked LM-head kernel (no "
            "full logits); vapo-lab materialises the response positions' logits and their entropy "
            "(a metric).",
        ]
    notes.append(
        "Nothing else is skipped on our side: every backward pass runs, also when all advantages "
        "are zero (a random policy rarely solves a problem: rewards are mostly 0 on both sides)."
    )
    return notes
