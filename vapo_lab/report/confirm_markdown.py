"""The scored plan (``confirm.score``) as Markdown: a table a Holm family, the plateau rule, the
claims, the goal's tally and the rank agreement, then the rules as pre-registered."""

from __future__ import annotations

from typing import Any

from vapo_lab.report import precision, stats
from vapo_lab.report.confirm import FOUND, PLATEAU_TOLERANCE, SCORE_MEASURES
from vapo_lab.report.predictions import MEASURES


def _verdict_text(r: dict[str, Any]) -> str:
    """Returns a verdict in bold with the finding that qualifies it, if any."""
    return f"**{r['verdict']}**" + (f" ({FOUND}: {r['finding']})" if r.get("finding") else "")


def _num(v: float | None, digits: int, signed: bool = False) -> str:
    return "" if v is None else precision.fixed(v, digits, signed)


def _digits(measure: str) -> int:
    if measure in SCORE_MEASURES or measure in ("long_accuracy", "direct_share", "eval_length"):
        return precision.SCORE
    return precision.FRACTION if measure == "clipfrac_high" else precision.DIAGNOSTIC


def _measure_text(r: dict[str, Any]) -> str:
    if r["measure"] in SCORE_MEASURES:
        return SCORE_MEASURES[r["measure"]][1].split(":")[0]
    window = f" ({r['window']})" if MEASURES[r["measure"]].windowed else ""
    return MEASURES[r["measure"]].text + window


def to_markdown(result: dict[str, Any], source: str = "") -> str:
    """Returns the scored plan as Markdown: a table a family, the plateau check, claims, goal."""
    pv = precision.p_value
    alpha = result["alpha"]
    lines = []
    pc = result["plateau"]
    if pc["flat"] is not None:
        pts = ", ".join(
            f"{precision.fixed(v, precision.SCORE)} at step {s}" for s, v in pc["points"].items()
        )
        lines += [
            f"**Plateau rule** (VAPO's seed-mean held-out curve over the last 20% of the steps "
            f"moves at most {PLATEAU_TOLERANCE:g} point): {'held' if pc['flat'] else 'NOT held'}: "
            f"{pts} ({pc['seeds']} seeds; spread "
            f"{precision.fixed(pc['spread'], precision.SCORE)}).",
            "",
        ]
    for fam, info in result["families"].items():
        rows = [r for r in result["predictions"] if r["family"] == fam]
        lines += [
            f"**{fam}: {info.get('text', '')}** (experiment `{info['experiment']}`)",
            "",
            "| # | comparison | measure | expected | test (n) | difference [95% interval] | p "
            "| p tested | Holm p | verdict | paper's direction |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            d = _digits(r["measure"])
            expect = r["expect"] + (f" (±{r['margin']:g})" if r["margin"] is not None else "")
            diff = (
                ""
                if r["difference"] is None
                else (
                    f"{_num(r['difference'], d, True)} "
                    f"[{_num(r['ci95'][0], d, True)}, {_num(r['ci95'][1], d, True)}]"
                )
            )
            test = r["note"] or ("" if r["test"] is None else f"{r['test']} ({r['n']})")
            tested = (
                ""
                if r["p_tested"] is None
                else ("TOST " if r["expect"] == "same" else "") + pv(r["p_tested"])
            )
            lines.append(
                f"| {r['id']} | {r['comparison']} | {_measure_text(r)} | {expect} | {test} "
                f"| {diff} | "
                f"{'' if r['p'] is None else pv(r['p'])} | {tested} | "
                f"{'' if r['holm_p'] is None else pv(r['holm_p'])} | {_verdict_text(r)} | "
                f"{'yes' if r['paper_direction'] else 'no'} |"
            )
        lines.append("")
    counts = {
        v: sum(r["verdict"] == v for r in result["predictions"])
        for v in ("confirmed", "refuted", "inconclusive", "not determinable")
    }
    g = result["goal"]
    lines += ["Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".", ""]
    lines += [
        f"- {c['text'] if 'text' in c else c['claim']}: **{c['verdict']}** ({c['detail']}"
        + (f"; {FOUND}: {c['finding']}" if c.get("finding") else "")
        + ")."
        for c in result["claims"]
    ]
    for label, moved in (
        ("on an outcome (plateau score or learning speed)", g.get("moved_outcome", [])),
        ("on a mechanism measure", g.get("moved_mechanism", [])),
    ):
        lines.append(
            f"- Components separable in the paper's direction {label} (a prediction counting for "
            f"them significant after Holm, two-sided, the paper's sign): {len(moved)} of "
            f"{len(g['components'])}" + (f" ({', '.join(moved)})." if moved else ".")
        )
    rows_of = {"": result.get("plateau_rows", {})} | {
        f" of `{e}`": rows for e, rows in result.get("plateau_other", {}).items()
    }
    for where, rows in rows_of.items():
        if not rows:
            continue
        rising = {v: c for v, c in rows.items() if c["flat"] is False}
        lines.append(
            f"- Plateau rule on every row{where} (its seed-mean curve over the last 20% of the "
            f"steps moves at most {PLATEAU_TOLERANCE:g} point): "
            + (
                "NOT held by "
                + ", ".join(
                    f"{v} ({precision.fixed(c['spread'], precision.SCORE)})"
                    for v, c in rising.items()
                )
                + ": their plateau scores are scores still moving."
                if rising
                else "held by every row."
            )
        )
    rk = result["rank"]
    if rk.get("spearman") is not None:
        ci = rk.get("spearman_ci")
        goal = result.get("rank_goal")
        lines.append(
            f"- Spearman ρ of the {rk['n']} rows' mean plateau scores against the paper's: "
            f"{precision.fixed(rk['spearman'], precision.CORRELATION)}"
            + (
                f" [{stats.LEVEL} bootstrap interval "
                f"{precision.fixed(ci[0], precision.CORRELATION)}, "
                f"{precision.fixed(ci[1], precision.CORRELATION)}]"
                if ci
                else ""
            )
            + (
                f"; the goal ρ ≥ {goal:g}: {'met' if rk['spearman'] >= goal else 'not met'}."
                if goal
                else "."
            )
        )
    if any(r.get("finding") for r in result["predictions"]):
        lines += [
            "",
            f"{FOUND.capitalize()}: not pre-registered; the report's findings file "
            "(`vapo-lab report --findings`), each text beside the verdict it qualifies.",
        ]
    lines += [
        "",
        f"Rules (pre-registered{f' in {source}' if source else ''}): paired t-test by seed where "
        f"both sides have the same seeds, else Welch's; sign-flip p beside it, deciding nothing. "
        f"p tested: the two-sided p of a directional prediction, the TOST p of a 'same' one "
        f"(equivalence within ±margin); Holm over the family; α = {alpha:g}. Directional: "
        f"confirmed when Holm p < α with the predicted sign, refuted with the other; same: "
        f"confirmed when Holm p < α, refuted when the 95% interval lies wholly outside ±margin; "
        f"else inconclusive. Paper's direction: the two-sided p, Holm-adjusted over the family's "
        f"two-sided p-values, < α with the paper's sign.",
    ]
    return "\n".join(lines) + "\n"
