"""Builds Table 1: our score per variant beside the paper's, seed statistics and rank agreement.

A run's score is its held-out avg@k ×100, read from its curve as ``SCORES`` says (``final`` by
default). A variant's is the mean over its finished seeds with the sample std (n-1), the seed
count and a 95% bootstrap interval, and whether the seeds separate it from VAPO; a variant with no
finished seed reads "not run" or "running, step k". The statistics and their rules are
``stats``'s, and ``stats.NOTE`` prints them under the table.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any

from vapo_lab.registry.presets import PRESETS
from vapo_lab.registry.table1 import ABLATED, paper_scores
from vapo_lab.report import precision, stats
from vapo_lab.report.collect import RunData


@dataclass
class Row:
    variant: str
    scores: list[float]  # one per finished seed, x100
    run_ids: list[str]
    state: str  # "" when scored, else "not run" / "running, step k" / "failed"
    paper: float | None
    other: list[float] = field(default_factory=list)  # the same runs' scores by the other criterion
    # each score's seed: cells of one grid pair by seed
    seeds: list[int] = field(default_factory=list)

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
    """Returns the sample standard deviation (n-1); None under two values (no spread)."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# what a run's score is (``--score``): its held-out curve read four ways
SCORES = {
    "final": "the last evaluation",
    "best": "the run's highest evaluation (optimistic: it selects on the eval set)",
    "plateau": "the mean of the evaluations in the last 20% of the training steps",
    "speed": "the area under the held-out curve (trapezoids) over the steps, divided by them",
}
PLATEAU_FRACTION = 0.2


def run_score(run: RunData, key: str, which: str = "final") -> float | None:
    """Returns a run's held-out score x100 by ``which`` (``SCORES``); None without an evaluation."""
    h = sorted(run.history.get(key, []))
    if not h:
        return None
    if which == "final":
        return 100 * h[-1][1]
    if which == "best":
        return 100 * max(v for _, v in h)
    first, last = h[0][0], h[-1][0]
    if which == "plateau":
        tail = [v for s, v in h if s >= last - PLATEAU_FRACTION * last]
        return 100 * sum(tail) / len(tail)
    if last == first:
        return 100 * h[0][1]
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(h, h[1:]))
    return 100 * area / (last - first)


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
        rows.append(
            Row(
                variant=name,
                scores=[run_score(r, key, which) for r in done],  # type: ignore[misc]
                run_ids=[r.run_id for r in done],
                state=state,
                paper=paper.get(name),
                other=[run_score(r, key, OTHER[which]) for r in done],  # type: ignore[misc]
                seeds=[r.seed for r in done],
            )
        )
    return rows


def rank_agreement(rows: list[Row]) -> dict[str, Any]:
    """Returns Spearman ρ and Kendall τ-b of our means against the paper's, with their intervals."""
    both = [r for r in rows if r.mean is not None and r.paper is not None]
    if len(both) < 2:
        return {
            "n": len(both),
            "spearman": None,
            "kendall": None,
            "spearman_ci": None,
            "kendall_ci": None,
        }
    rho, tau = stats.rank_correlations([r.mean for r in both], [r.paper for r in both])  # type: ignore[misc]
    ci = stats.rank_interval([r.scores for r in both], [r.paper for r in both])  # type: ignore[misc]
    why = "no row has 2 seeds" if ci is None else "a resample left every row mean equal"
    ci = ci or {}
    return {
        "n": len(both),
        "spearman": rho,
        "kendall": tau,
        "spearman_ci": ci.get("spearman"),
        "kendall_ci": ci.get("kendall"),
        "resampled_rows": sum(r.n >= 2 for r in both),
        "no_interval": None if ci.get("spearman") and ci.get("kendall") else why,
    }


def _fmt(v: float | None, signed: bool = False) -> str:
    """Returns a score in points, or a difference of scores, at ``precision.SCORE`` places."""
    return "" if v is None else precision.fixed(v, precision.SCORE, signed)


def against_reference(rows: list[Row]) -> dict[str, tuple[stats.Test, float]]:
    """Returns {variant: (its test against VAPO, the Holm-adjusted p over the rows tested)}: paired
    by seed where the row and VAPO have the same seeds, else Welch; rows or a VAPO with under 2
    seeds are not tested."""
    reference = PRESETS.get(ABLATED).table1_row
    vapo = next((r for r in rows if r.variant == reference), None)
    if vapo is None:
        return {}
    ref = dict(zip(vapo.seeds, vapo.scores))
    tests = {
        r.variant: t
        for r in rows
        if r.variant != reference
        and (t := stats.compare(dict(zip(r.seeds, r.scores)), ref)) is not None
    }
    return dict(zip(tests, zip(tests.values(), stats.holm([t.p for t in tests.values()]))))


def table_records(rows: list[Row]) -> list[dict[str, Any]]:
    """Returns one dict per row: ours (mean, std, 95% interval, n), delta vs our VAPO with its
    interval, the test against VAPO (Holm-adjusted over the rows) and whether it separates the row,
    the paper's score and delta, and the other score."""
    reference = PRESETS.get(ABLATED).table1_row  # deltas are against VAPO, ours and the paper's
    vapo = next((r for r in rows if r.variant == reference), None)
    ours_ref = vapo.mean if vapo else None
    paper_ref = paper_scores()[reference]
    tests = against_reference(rows)
    out = []
    for r in rows:
        is_ref = r.variant == reference
        delta_ci = (
            None if is_ref or vapo is None else stats.difference_interval(r.scores, vapo.scores)
        )
        test, holm_p = tests.get(r.variant, (None, None))
        out.append(
            {
                "variant": r.variant,
                "mean": r.mean,
                "std": r.std,
                "ci": stats.mean_interval(r.scores),
                "seeds": r.n,
                "state": r.state,
                "delta": None if r.mean is None or ours_ref is None else r.mean - ours_ref,
                "delta_ci": delta_ci,
                "test": None if test is None else test.name,
                "p": None if test is None else test.p,
                "holm_p": holm_p,
                "sign_flip_p": None if test is None else test.sign_flip_p,
                "separable": None if holm_p is None else holm_p < stats.ALPHA,
                "reference": is_ref,
                "paper": r.paper,
                "paper_delta": None if r.paper is None else r.paper - paper_ref,
                "run_ids": r.run_ids,
                "other_mean": _mean(r.other),
                "other_std": _std(r.other),
            }
        )
    return out


# the column beside
OTHER = {
    "final": "best",
    "best": "final",
    "plateau": "speed",
    "speed": "plateau",
}


def _other_label(score_label: str) -> str:
    """Returns the other column's label: "avg@4 final" -> "avg@4 best", and so on, and back."""
    head, which = score_label.rsplit(" ", 1)
    return f"{head} {OTHER[which]}"


NO_INTERVAL = "n=1, no interval"  # one seed: no spread, so neither "± 0.0" nor an interval


def _mean_std(mean: float | None, std: float | None, pm: str = " ± ") -> str:
    """Returns "49.5 ± 0.8"; the bare mean for one seed (no spread); "" for none."""
    if mean is None:
        return ""
    return _fmt(mean) if std is None else f"{_fmt(mean)}{pm}{_fmt(std)}"


def _interval(ci: tuple[float, float] | None, signed: bool = False) -> str:
    return "" if ci is None else f"[{_fmt(ci[0], signed)}, {_fmt(ci[1], signed)}]"


def _ci_cell(d: dict[str, Any]) -> str:
    """Returns the row's interval cell, or why there is none for a scored row with one seed."""
    if d["ci"] is not None:
        return _interval(d["ci"])
    return NO_INTERVAL if d["seeds"] == 1 else ""


def _delta_cell(d: dict[str, Any]) -> str:
    return " ".join(x for x in (_fmt(d["delta"], True), _interval(d["delta_ci"], True)) if x)


def _separable_cell(d: dict[str, Any], dash: str = "—") -> str:
    """Returns yes or no with the test; "reference" on VAPO's row; ``dash`` (not determinable) for a
    scored row not tested (it or VAPO has one seed); "" for an unscored row."""
    if d["reference"]:
        return "reference" if d["mean"] is not None else ""
    if d["separable"] is None:
        return dash if d["mean"] is not None else ""
    flip = (
        "" if d["sign_flip_p"] is None else f"; sign-flip p {precision.p_value(d['sign_flip_p'])}"
    )
    return (
        f"{'yes' if d['separable'] else 'no'} "
        f"({d['test']}, Holm p {precision.p_value(d['holm_p'])}{flip})"
    )


def _rank_text(ra: dict[str, Any]) -> str:
    def one(v: float | None, ci: tuple[float, float] | None) -> str:
        if v is None:
            return "undefined (one side is constant)"
        r = [precision.fixed(x, precision.CORRELATION) for x in (v, *(ci or ()))]
        return (
            f"{r[0]} [{stats.LEVEL} interval {r[1]}, {r[2]}]"
            if ci
            else f"{r[0]} (no interval: {ra['no_interval']})"
        )

    if ra["n"] < 2:
        return f"Rank agreement with the paper: needs at least 2 scored rows ({ra['n']} so far)."
    return (
        f"Rank agreement with the paper over {ra['n']} rows: "
        f"Spearman ρ = {one(ra['spearman'], ra['spearman_ci'])}, "
        f"Kendall τ-b = {one(ra['kendall'], ra['kendall_ci'])}."
    )


def to_markdown(rows: list[Row], score_label: str) -> str:
    pct = stats.LEVEL
    lines = [
        f"| variant | ours: {score_label} (mean ± std) | {pct} interval | seeds "
        f"| Δ vs our VAPO [{pct} interval] "
        f"| separable from VAPO | paper (AIME24 avg@32) | paper Δ "
        f"| ours: {_other_label(score_label)} (mean ± std) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in table_records(rows):
        ours = d["state"] or _mean_std(d["mean"], d["std"])
        lines.append(
            f"| {d['variant']} | {ours} | {_ci_cell(d)} | {d['seeds']} | {_delta_cell(d)} | "
            f"{_separable_cell(d)} | {_fmt(d['paper'])} | {_fmt(d['paper_delta'], True)} | "
            f"{_mean_std(d['other_mean'], d['other_std'])} |"
        )
    lines += ["", _rank_text(rank_agreement(rows)), "", stats.NOTE]
    return "\n".join(lines) + "\n"


def to_latex(rows: list[Row], score_label: str) -> str:
    pct = stats.LEVEL.replace("%", r"\%")
    lines = [
        r"\begin{tabular}{lrrrrlrrr}",
        r"\toprule",
        rf"Variant & Ours ({score_label}) & {pct} interval & Seeds & $\Delta$ [{pct}] & "
        rf"Separable & Paper & "
        rf"Paper $\Delta$ & Ours ({_other_label(score_label)}) \\",
        r"\midrule",
    ]
    pm = r" \pm "
    for d in table_records(rows):
        name = d["variant"].replace("_", r"\_")
        ours = d["state"] or f"${_mean_std(d['mean'], d['std'], pm)}$"
        other = (
            "" if d["other_mean"] is None else f"${_mean_std(d['other_mean'], d['other_std'], pm)}$"
        )
        lines.append(
            f"{name} & {ours} & {_ci_cell(d)} & {d['seeds']} & {_delta_cell(d)} & "
            f"{_separable_cell(d, '---')} & {_fmt(d['paper'])} & "
            f"{_fmt(d['paper_delta'], True)} & {other} \\\\"
        )
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _num(v: float | None) -> str:
    return "" if v is None else precision.fixed(v, precision.CSV)


def _p(v: float | None) -> str:
    return "" if v is None else precision.p_value(v)


def to_csv(rows: list[Row]) -> str:
    """Returns Table 1 as CSV, numbers to ``precision.CSV`` places, missing values empty."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "variant",
            "mean",
            "std",
            "ci_low",
            "ci_high",
            "seeds",
            "state",
            "delta_vs_vapo",
            "delta_ci_low",
            "delta_ci_high",
            "test",
            "p",
            "holm_p",
            "separable_from_vapo",
            "paper",
            "paper_delta",
            "run_ids",
            "other_mean",
            "other_std",
        ]
    )
    for d in table_records(rows):
        ci, dci = d["ci"] or (None, None), d["delta_ci"] or (None, None)
        sep = "" if d["separable"] is None else ("yes" if d["separable"] else "no")
        w.writerow(
            [
                d["variant"],
                _num(d["mean"]),
                _num(d["std"]),
                _num(ci[0]),
                _num(ci[1]),
                d["seeds"],
                d["state"],
                _num(d["delta"]),
                _num(dci[0]),
                _num(dci[1]),
                d["test"] or "",
                _p(d["p"]),
                _p(d["holm_p"]),
                sep,
                _fmt(d["paper"]),
                _fmt(d["paper_delta"], True),
                " ".join(d["run_ids"]),
                _num(d["other_mean"]),
                _num(d["other_std"]),
            ]
        )
    return buf.getvalue()
