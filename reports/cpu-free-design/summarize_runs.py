"""Prints the design runs' curves from their metrics.jsonl (issue 47; docs/cpu-task-design.md).

  python summarize_runs.py RUN_DIR [RUN_DIR ...] [--json out.json]

Per run: held-out avg@k and per-stratum accuracy at each evaluation; per block of training steps the
rollout accuracy, response length, share of full responses (eval), entropy, clip fractions, the
critic's value bias by position, and the mean seconds per training step and per evaluation.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(run: Path) -> tuple[list[dict], list[dict]]:
    train, pre = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        keys = [k for k in rec if k not in ("step", "timestamp_ms")]
        (pre if keys and all(k.startswith("pretrain/") for k in keys) else train).append(rec)
    return train, pre


def mean(recs, key):
    xs = [r[key] for r in recs if key in r and r[key] == r[key]]
    return round(statistics.fmean(xs), 4) if xs else None


def summarize(run: Path, block: int) -> dict:
    train, pre = load(run)
    evals = [r for r in train if any(k.startswith("eval/avg_at_") for k in r)]
    out = {"run": str(run), "evals": [], "blocks": [], "pretrain_steps": len(pre)}
    for r in evals:
        avg = next(v for k, v in r.items() if k.startswith("eval/avg_at_"))
        out["evals"].append(
            {
                "step": r["step"],
                "avg": round(100 * avg, 2),
                **{
                    k[5:]: round(v, 4)
                    for k, v in r.items()
                    if k.startswith(
                        (
                            "eval/acc_",
                            "eval/length_",
                            "eval/full_",
                            "eval/mode_",
                            "eval/pass_at",
                            "eval/response_length",
                        )
                    )
                },
            }
        )
    steps = [r for r in train if r["step"] > 0 and "rollout/accuracy" in r]
    for lo in range(1, (max(r["step"] for r in steps) if steps else 0) + 1, block):
        recs = [r for r in steps if lo <= r["step"] < lo + block]
        keys = [
            "rollout/accuracy",
            "rollout/response_length",
            "actor/entropy",
            "actor/clipfrac_high",
            "actor/clipfrac_low",
            "critic/explained_variance",
            "critic/value_mean",
            "diag/value_bias/000_007",
            "diag/value_bias/008_015",
            "diag/value_bias/016_031",
            "diag/value_bias/032_063",
            "diag/value_bias/064_127",
            "diag/value_bias/all",
            "diag/length/correct_mean",
            "diag/length/wrong_mean",
            "time/step_s",
            "time/rollout_s",
        ]
        out["blocks"].append(
            {"steps": f"{lo}-{lo + block - 1}", **{k: mean(recs, k) for k in keys}}
        )
    # seconds per evaluation: the gap between an eval step's record and what its training step took
    out["time_step_s"] = mean(steps, "time/step_s")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = [summarize(Path(r), args.block) for r in args.runs]
    for s in res:
        print("==", s["run"], "mean step s", s["time_step_s"])
        for e in s["evals"]:
            print(" eval", e)
        for b in s["blocks"]:
            print(" ", b)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
