"""Prints each design run's CPU time (from `/usr/bin/time -v` in its log), wall time, steps and
evaluations.

  python costs.py LOG_DIR RUNS_DIR

CPU time (user + system) of a one-thread run is the core time it used, whatever the machine's load;
wall time on the shared machine was 2-3x longer.
"""

import json
import re
import sys
from pathlib import Path


def main():
    logs, runs = Path(sys.argv[1]), Path(sys.argv[2])
    print(
        "| run | steps | evaluations | pretraining steps | CPU s (user+sys) | wall "
        "| CPU s per step incl. evals |"
    )
    print("|---|---|---|---|---|---|---|")
    for log in sorted(logs.glob("*.log")):
        text = log.read_text()
        user = re.search(r"User time \(seconds\): ([\d.]+)", text)
        sys_ = re.search(r"System time \(seconds\): ([\d.]+)", text)
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
        metrics = runs / log.stem / "metrics.jsonl"
        if not (user and metrics.exists()):
            continue
        recs = [json.loads(line) for line in metrics.read_text().splitlines()]
        steps = max((r["step"] for r in recs if "time/step_s" in r), default=0)
        evals = sum(1 for r in recs if any(k.startswith("eval/avg_at_") for k in r))
        pre = sum(1 for r in recs if any(k.startswith("pretrain/") for k in r))
        cpu = float(user.group(1)) + float(sys_.group(1))
        print(
            f"| {log.stem} | {steps} | {evals} | {pre} | {cpu:.0f} | {wall.group(1)} "
            f"| {cpu / max(steps, 1):.1f} |"
        )


if __name__ == "__main__":
    main()
