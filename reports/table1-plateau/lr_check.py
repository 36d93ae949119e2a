"""Prints predictions.md's learning-rate check: each preset's plateau score and learning speed at
each actor lr, seeds 0-2, from runs exports, scored by the report's own `run_score`; then whether
VAPO's best beats PPO's and DAPO's best, by how much, and whether predictions.md's rule calls the
main grid's VAPO-above verdict dependent on the step size. Each preset at each lr is checked by
the report's plateau rule (its seed-mean curve over the last 20% of the steps moves at most 1
point): a comparison of scores not at a plateau compares learning speeds, and says so.

    python reports/table1-plateau/lr_check.py reports/table1-plateau/runs.json.gz \
        reports/table1-plateau/lr-half/runs.json.gz reports/table1-plateau/lr-double/runs.json.gz
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from vapo_lab.report.collect import RunData, last_per_step, variant_of
from vapo_lab.report.confirm import PLATEAU_TOLERANCE, plateau_check
from vapo_lab.report.table import run_score
from vapo_lab.track.export import read_export

KEY = "eval/avg_at_16"
# the presets' Table 1 rows, as the report names a run's row
PRESETS = (
    "Vanilla PPO",
    "DAPO",
    "VAPO",
)
SEEDS = (0, 1, 2)
MAIN_LR = "2e-05"  # the main grid's actor lr, as its runs record it
MARGIN = 2.0  # points of plateau score: predictions.md's "within 2 points"


Cells = dict[tuple[str, str], dict[int, tuple[float, float, RunData]]]


def cells(paths: list[str]) -> Cells:
    """Returns {(preset, actor lr): {seed: (plateau score, learning speed, run)}} of preset runs."""
    found: Cells = defaultdict(dict)
    for path in paths:
        for run in read_export(path)["runs"]:  # the checked reader: a runs file is untrusted input
            tags = run["tags"]
            preset, seed = variant_of(tags), int(tags.get("seed", -1))
            if preset not in PRESETS or seed not in SEEDS or run["status"] != "FINISHED":
                continue
            data = RunData(
                run["run_id"],
                preset,
                seed,
                run["status"],
                tags,
                {KEY: last_per_step(run["metrics"][KEY])},
            )
            found[(preset, run["params"]["trainer.actor_lr"])][seed] = (
                run_score(data, KEY, "plateau"),
                run_score(data, KEY, "speed"),
                data,
            )
    return found


def plateau_text(check: dict) -> str:
    """Returns the plateau rule's verdict on one preset at one lr, with the curve's movement."""
    held = "at a plateau" if check["flat"] else "NOT at a plateau"
    return f"{held} (moves {check['spread']:.1f} over the last 20%, rule {PLATEAU_TOLERANCE:g})"


def main(paths: list[str]) -> None:
    table = cells(paths)
    best, flat = {}, {}
    for (preset, lr), seeds in sorted(
        table.items(), key=lambda kv: (PRESETS.index(kv[0][0]), float(kv[0][1]))
    ):
        plateau = [seeds[s][0] for s in sorted(seeds)]
        speed = statistics.mean(seeds[s][1] for s in seeds)
        mean = statistics.mean(plateau)
        check = plateau_check([seeds[s][2] for s in sorted(seeds)], KEY)
        flat[(preset, lr)] = check["flat"]
        print(
            f"{preset:11s} lr {float(lr):.0e}: plateau {mean:5.1f} (seeds {sorted(seeds)}: "
            f"{', '.join(f'{x:.1f}' for x in plateau)}), speed {speed:5.1f}, "
            f"{plateau_text(check)}"
        )
        if len(seeds) == len(SEEDS) and mean > best.get(preset, (None, -1.0))[1]:
            best[preset] = (lr, mean)
    for preset in ("Vanilla PPO", "DAPO"):
        if "VAPO" in best and preset in best:
            (lr_v, v), (lr_o, o) = best["VAPO"], best[preset]
            # predictions.md's rule: another preset's best at another lr than the main grid's,
            # within 2 points
            depends = lr_o != MAIN_LR and v - o <= MARGIN
            verdict = "depends on the step size" if depends else "does not depend on the step size"
            rising = [
                f"{p} at {float(lr):.0e}"
                for p, lr in (("VAPO", lr_v), (preset, lr_o))
                if not flat[(p, lr)]
            ]
            print(
                f"best VAPO ({v:.1f} at {float(lr_v):.0e}) - "
                f"best {preset} ({o:.1f} at {float(lr_o):.0e})"
                f" = {v - o:+.1f}: VAPO above {preset} {verdict}"
                + (f" (not at a plateau: {', '.join(rising)})" if rising else "")
            )


if __name__ == "__main__":
    main(sys.argv[1:])
