"""Table 1: our score per variant (mean ± std over seeds) beside the paper's, and rank agreement.

Score = held-out eval avg@k of a run, ×100. ``final`` (the default) is the last evaluation of a
finished run; ``best`` the highest evaluation of the run (optimistic: it selects on the eval set).
A variant's score is the mean over its finished seeds, with the sample standard deviation (n-1)
and the seed count; a variant with no finished seed reads "not run" or "running, step k".
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any

from vapo_lab.registry.table1 import ABLATED, paper_scores
from vapo_lab.registry.presets import PRESETS
from vapo_lab.report.collect import RunData


@dataclass
class Row:
    variant: str
    scores: list[float]  # one per finished seed, x100
    run_ids: list[str]
    state: str  # "" when scored, else "not run" / "running, step k" / "failed"
    paper: float | None
    other: list[float] = field(default_factory=list)  # the same runs' scores by the other criterion

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def mean(self) -> float | None:
        return sum(self.scores) / self.n if self.scores else None

    @property
    def std(self) -> float | None:
        return _std(self.scores)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    """Sample standard deviation (n-1); 0 for one value, None for none."""
    if len(xs) < 2:
        return 0.0 if xs else None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def run_score(run: RunData, key: str, which: str = "final") -> float | None:
    """Returns a finished run's final (or best) held-out score x100, None when it has none."""
    h = run.history.get(key, [])
    if not h:
        return None
    return 100 * (h[-1][1] if which == "final" else max(v for _, v in h))


def build_table(groups: dict[str, list[RunData]], key: str, which: str = "final") -> list[Row]:
    """Returns Table 1's rows in the paper's order, then any other variant the grid holds."""
    paper = paper_scores()
    order = list(paper) + sorted(set(groups) - set(paper))
    rows = []
    for name in order:
        runs = groups.get(name, [])
        done = [r for r in runs if r.status == "FINISHED" and run_score(r, key, which) is not None]
        state = ""
        if not done:
            running = [r for r in runs if r.status == "RUNNING"]
            if running:
                state = f"running, step {max(r.last_step() for r in running)}"
            elif runs:
                state = "failed" if all(r.status == "FAILED" for r in runs) else "not finished"
            else:
                state = "not run"
        other = "best" if which == "final" else "final"
        rows.append(Row(variant=name, scores=[run_score(r, key, which) for r in done],  # type: ignore[misc]
                        run_ids=[r.run_id for r in done], state=state, paper=paper.get(name),
                        other=[run_score(r, key, other) for r in done]))  # type: ignore[misc]
    return rows


def _ranks(values: list[float]) -> list[float]:
    """Returns 1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    """Returns Spearman's rho: Pearson's correlation of the (average-tie) ranks."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else float("nan")


def kendall(x: list[float], y: list[float]) -> float:
    """Returns Kendall's tau-b (tie-corrected) over all pairs."""
    conc = disc = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / denom if denom > 0 else float("nan")


def rank_agreement(rows: list[Row]) -> dict[str, Any]:
    """Returns Spearman and Kendall between our means and the paper's, over rows that have both."""
    both = [r for r in rows if r.mean is not None and r.paper is not None]
    if len(both) < 2:
        return {"n": len(both), "spearman": None, "kendall": None}
    ours, theirs = [r.mean for r in both], [r.paper for r in both]
    return {"n": len(both), "spearman": spearman(ours, theirs), "kendall": kendall(ours, theirs)}  # type: ignore[arg-type]


def _fmt(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def table_records(rows: list[Row]) -> list[dict[str, Any]]:
    """Returns one dict per row: variant, ours (mean, std, n), delta vs our VAPO, paper, paper delta."""
    reference = PRESETS.get(ABLATED).table1_row  # deltas are against VAPO, ours and the paper's
    vapo = next((r for r in rows if r.variant == reference), None)
    ours_ref = vapo.mean if vapo else None
    paper_ref = paper_scores()[reference]
    out = []
    for r in rows:
        out.append({
            "variant": r.variant, "mean": r.mean, "std": r.std, "seeds": r.n, "state": r.state,
            "delta": None if r.mean is None or ours_ref is None else r.mean - ours_ref,
            "paper": r.paper, "paper_delta": None if r.paper is None else r.paper - paper_ref,
            "run_ids": r.run_ids, "other_mean": _mean(r.other), "other_std": _std(r.other),
        })
    return out


def _other_label(score_label: str) -> str:
    """"avg@4 final" -> "avg@4 best" and back: the column beside the table's score."""
    return score_label.replace("final", "BEST").replace("best", "final").replace("BEST", "best")


def to_markdown(rows: list[Row], score_label: str) -> str:
    lines = [f"| variant | ours: {score_label} (mean ± std) | seeds | Δ vs our VAPO | paper (AIME24 avg@32) | paper Δ "
             f"| ours: {_other_label(score_label)} |", "|---|---|---|---|---|---|---|"]
    for d in table_records(rows):
        ours = d["state"] or f"{d['mean']:.1f} ± {d['std']:.1f}"
        other = "" if d["other_mean"] is None else f"{d['other_mean']:.1f} ± {d['other_std']:.1f}"
        lines.append(f"| {d['variant']} | {ours} | {d['seeds']} | {_fmt(d['delta'], True)} | "
                     f"{_fmt(d['paper'])} | {_fmt(d['paper_delta'], True)} | {other} |")
    ra = rank_agreement(rows)
    if ra["spearman"] is None:
        lines.append(f"\nRank agreement with the paper: needs at least 2 scored rows ({ra['n']} so far).")
    else:
        lines.append(f"\nRank agreement with the paper over {ra['n']} rows: Spearman ρ = {ra['spearman']:.2f}, "
                     f"Kendall τ-b = {ra['kendall']:.2f}.")
    return "\n".join(lines) + "\n"


def to_latex(rows: list[Row], score_label: str) -> str:
    lines = [r"\begin{tabular}{lrrrrrr}", r"\toprule",
             rf"Variant & Ours ({score_label}) & Seeds & $\Delta$ & Paper & Paper $\Delta$ & Ours ({_other_label(score_label)}) \\",
             r"\midrule"]
    for d in table_records(rows):
        name = d["variant"].replace("_", r"\_")
        ours = d["state"] or f"${d['mean']:.1f} \\pm {d['std']:.1f}$"
        other = "" if d["other_mean"] is None else f"${d['other_mean']:.1f} \\pm {d['other_std']:.1f}$"
        lines.append(f"{name} & {ours} & {d['seeds']} & {_fmt(d['delta'], True)} & {_fmt(d['paper'])} & "
                     f"{_fmt(d['paper_delta'], True)} & {other} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["variant", "mean", "std", "seeds", "state", "delta_vs_vapo", "paper", "paper_delta", "run_ids",
                "other_mean", "other_std"])
    for d in table_records(rows):
        w.writerow([d["variant"], "" if d["mean"] is None else f"{d['mean']:.4f}",
                    "" if d["std"] is None else f"{d['std']:.4f}", d["seeds"], d["state"],
                    "" if d["delta"] is None else f"{d['delta']:.4f}", _fmt(d["paper"]),
                    _fmt(d["paper_delta"], True), " ".join(d["run_ids"]),
                    "" if d["other_mean"] is None else f"{d['other_mean']:.4f}",
                    "" if d["other_std"] is None else f"{d['other_std']:.4f}"])
    return buf.getvalue()
