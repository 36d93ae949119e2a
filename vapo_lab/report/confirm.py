"""Scores a pre-registered confirmatory plan: a t-test per prediction, Holm per family.

A plan is a predictions YAML with ``families`` (``reports/table1-plateau/predictions.yaml``); the
older format without them is ``predictions``'. Each prediction compares a variant with a reference
(VAPO unless ``against`` names one), or tests a per-seed ``contrast`` of variants, on
``plateau_score``, ``learning_speed`` or one of ``predictions.MEASURES``; a "same" prediction is
tested for equivalence within its ``margin``. Beside the verdicts come the goal's tally of
components, the claims, the plateau rule and the rank agreement with the paper. The rules:
docs/report.md#predictions. Its Markdown: ``confirm_markdown``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vapo_lab.registry.components import COMPONENTS
from vapo_lab.registry.presets import PRESETS
from vapo_lab.registry.table1 import ABLATED, paper_scores, row_name
from vapo_lab.report import stats
from vapo_lab.report.collect import ReportError, RunData
from vapo_lab.report.predictions import DIRECTIONS, MEASURES, WINDOWS
from vapo_lab.report.table import PLATEAU_FRACTION, run_score

SCORE_MEASURES = {
    "plateau_score": (
        "plateau",
        "plateau score: mean held-out score over the last 20% of the steps (x100)",
    ),
    "learning_speed": (
        "speed",
        "learning speed: area under the held-out curve over the steps (x100)",
    ),
}
# points: VAPO's seed-mean curve over the last 20% of the steps moves at most this
PLATEAU_TOLERANCE = 1.0
FOUND = "found after the grid"
# what a goal tally counts: outcomes (the held-out score's plateau or learning speed) apart from
# mechanisms (the diagnostics: value bias, advantage gap, clip fraction, entropy, ...)
OUTCOME, MECHANISM = (
    ("outcome",),
    ("mechanism",),
)  # the words before a finding, wherever a verdict carries one

Groups = dict[str, list[RunData]]


@dataclass(frozen=True)
class Planned:
    id: str
    family: str
    measure: str
    window: str
    expect: str
    paper: str
    # (variant label, coefficient): row +1 and reference −1, or a contrast
    terms: tuple[tuple[str, float], ...]
    margin: float | None = None
    counts_for: str | None = None  # a component, or None


@dataclass
class Plan:
    source: str
    alpha: float
    families: dict[str, dict[str, str]]  # id -> {experiment, text}
    predictions: list[Planned]
    claims: list[str] = field(default_factory=list)
    rank_goal: float | None = None

    @property
    def main(self) -> str:
        """Returns the experiment of the first family: the Table 1 grid."""
        return next(iter(self.families.values()))["experiment"]


def is_plan(path: str | Path) -> bool:
    """Returns whether a predictions YAML is a confirmatory plan (it has ``families``)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "families" in doc


def _variant(name: str) -> str:
    """Returns a preset or component name as its Table 1 row ("ppo" -> "Vanilla PPO")."""
    return row_name(name) if name in PRESETS or name in COMPONENTS.names() else name


def load(path: str | Path) -> Plan:
    """Returns the plan in a predictions YAML with ``families``.

    Raises:
        ReportError: a malformed entry (one line naming it and the fix).
    """
    import yaml

    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    families = doc.get("families")
    if (
        not isinstance(families, dict)
        or not families
        or not all(isinstance(f, dict) and "experiment" in f for f in families.values())
    ):
        raise ReportError(
            f"--predictions {path}: 'families' must map each family id to {{experiment, text}}"
        )
    out = []
    for i, e in enumerate(doc.get("predictions") or []):
        where = f"--predictions {path}: entry {e.get('id', i) if isinstance(e, dict) else i}"
        if not isinstance(e, dict):
            raise ReportError(f"{where} is not a mapping")
        missing = [k for k in ("id", "family", "measure", "expect", "paper") if k not in e]
        if missing or ("row" in e) == ("contrast" in e):
            raise ReportError(
                f"{where}: needs id, family, measure, expect, paper and either row or contrast "
                f"(lacks {', '.join(missing) or 'row/contrast'})"
            )
        window = e.get("window", "all")
        for name, value, choices in (
            ("family", e["family"], list(families)),
            ("measure", e["measure"], [*SCORE_MEASURES, *MEASURES]),
            ("window", window, list(WINDOWS)),
            ("expect", e["expect"], list(DIRECTIONS)),
            ("paper", e["paper"], list(DIRECTIONS)),
        ):
            if value not in choices:
                raise ReportError(
                    f"{where}: {name} {value!r} is not one of {', '.join(map(str, choices))}"
                )
        if e["expect"] == "same" and not isinstance(e.get("margin"), (int, float)):
            raise ReportError(
                f"{where}: a 'same' prediction needs its equivalence margin (margin: 2)"
            )
        if "row" in e:
            terms = ((_variant(e["row"]), 1.0), (_variant(e.get("against", ABLATED)), -1.0))
        else:
            terms = tuple((_variant(k), float(v)) for k, v in e["contrast"].items())
        counts = e.get("counts_for", e.get("row") if e.get("row") in COMPONENTS.names() else None)
        out.append(
            Planned(
                str(e["id"]),
                e["family"],
                e["measure"],
                window,
                e["expect"],
                e["paper"],
                terms,
                float(e["margin"]) if "margin" in e else None,
                None if counts == "none" else counts,
            )
        )
    return Plan(
        str(doc.get("source", "")),
        float(doc.get("alpha", stats.ALPHA)),
        families,
        out,
        list(doc.get("claims") or []),
        doc.get("rank_goal"),
    )


def _value(run: RunData, measure: str, window: str, key: str) -> float | None:
    if measure in SCORE_MEASURES:
        return run_score(run, key, SCORE_MEASURES[measure][0])
    return MEASURES[measure].read(run, window, key)


def per_seed(runs: list[RunData], measure: str, window: str, key: str) -> dict[int, float]:
    """Returns {seed: value} over the finished runs that have the measure."""
    return {
        r.seed: v
        for r in runs
        if r.status == "FINISHED" and (v := _value(r, measure, window, key)) is not None
    }


def _test(p: Planned, groups: Groups, key: str) -> tuple[stats.Test | None, dict[str, int]]:
    values = {
        label: per_seed(groups.get(label, []), p.measure, p.window, key) for label, _ in p.terms
    }
    seeds = {label: len(v) for label, v in values.items()}
    if len(p.terms) == 2:
        (a, _), (b, _) = p.terms
        return stats.compare(values[a], values[b]), seeds
    # a contrast needs every term's seed
    common = set.intersection(*(set(v) for v in values.values()))
    return stats.paired(
        [sum(c * values[label][s] for label, c in p.terms) for s in sorted(common)]
    ), seeds


def _verdict(p: Planned, t: stats.Test | None, adjusted: float | None, alpha: float) -> str:
    if t is None or adjusted is None:
        return "not determinable"
    if p.expect == "same":
        assert p.margin is not None
        if adjusted < alpha:
            return "confirmed"
        outside = t.ci95[0] > p.margin or t.ci95[1] < -p.margin
        return "refuted" if outside else "inconclusive"
    if adjusted >= alpha or t.difference == 0:
        return "inconclusive"
    return "confirmed" if (t.difference < 0) == (p.expect == "lower") else "refuted"


def score(
    plan: Plan, groups_of: Callable[[str], Groups], key_of: Callable[[str], str]
) -> dict[str, Any]:
    """Returns every prediction tested and judged, the goal's tally, the claims, the plateau check
    and the rank agreement; ``groups_of(experiment)`` gives an experiment's runs by variant and
    ``key_of(experiment)`` its held-out score metric."""
    results: list[dict[str, Any]] = []
    read: dict[str, tuple[Groups, str]] = {}  # the grids the families read, for the plateau rule
    for fam, info in plan.families.items():
        members = [p for p in plan.predictions if p.family == fam]
        try:
            groups, key = groups_of(info["experiment"]), key_of(info["experiment"])
        except ReportError as e:
            results += [
                _row(p, None, {}, None, None, "not determinable", False, f"no runs: {e}")
                for p in members
            ]
            continue
        read[info["experiment"]] = groups, key
        tested = [(p, *_test(p, groups, key)) for p in members]
        own = [
            None if t is None else stats.tost_p(t, p.margin) if p.expect == "same" else t.p
            for p, t, _ in tested
        ]
        adj = _holm_some(own)
        two_sided = _holm_some([None if t is None else t.p for _, t, _ in tested])
        for (p, t, seeds), o, a, d in zip(tested, own, adj, two_sided):
            moved = (
                t is not None
                and d is not None
                and d < plan.alpha
                and p.paper != "same"
                and t.difference != 0
                and (t.difference < 0) == (p.paper == "lower")
            )
            note = None if t is not None else _too_few(seeds)
            results.append(_row(p, t, seeds, o, a, _verdict(p, t, a, plan.alpha), moved, note, d))
    components = sorted(
        {p.counts_for for p in plan.predictions if p.counts_for}, key=COMPONENTS.names().index
    )

    def moved_on(kinds: tuple[str, ...] | None) -> list[str]:
        """The components with a paper-direction result on a measure of ``kinds`` (None: any)."""
        return [
            c
            for c in components
            if any(
                r["paper_direction"]
                and r["counts_for"] == c
                and (kinds is None or (r["measure"] in SCORE_MEASURES) == (kinds == OUTCOME))
                for r in results
            )
        ]

    main_groups, main_key = groups_of(plan.main), key_of(plan.main)
    return {
        "alpha": plan.alpha,
        "families": plan.families,
        "predictions": results,
        "goal": {
            "components": components,
            "moved": moved_on(None),
            "moved_outcome": moved_on(OUTCOME),
            "moved_mechanism": moved_on(MECHANISM),
        },
        "claims": [_claim(c, results) for c in plan.claims],
        "plateau": plateau_check(main_groups.get(row_name(ABLATED), []), main_key),
        "plateau_rows": _plateau_rows(main_groups, main_key),
        # the other families' grids (a learning-rate check, a setting): a grid with no runs is
        # left out, its predictions "not determinable" already
        "plateau_other": {e: _plateau_rows(*read[e]) for e in sorted(read) if e != plan.main},
        "rank": _rank(main_groups, main_key),
        "rank_goal": plan.rank_goal,
    }


def load_findings(path: str | Path) -> dict[str, str]:
    """Returns a findings YAML's ``findings``: {prediction id or claim: what was found after the
    grid that qualifies its verdict}, e.g. a learning-rate check. Not pre-registered, and printed
    as such beside the verdicts it qualifies.

    Raises:
        ReportError: not a mapping of ids to texts (one line naming the fix).
    """
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ReportError(f"--findings {path}: cannot be read ({e}); give a findings YAML") from e
    found = doc.get("findings") if isinstance(doc, dict) else None
    if not isinstance(found, dict) or not all(
        isinstance(t, str) and t.strip() for t in found.values()
    ):
        raise ReportError(
            f"--findings {path}: needs 'findings:' mapping each prediction id or claim to a text"
        )
    return {str(k): t.strip() for k, t in found.items()}


def qualify(result: dict[str, Any], findings: dict[str, str]) -> None:
    """Attaches each finding to its prediction (by id) and claim (by name, or by the prediction
    the claim is read from), so that every verdict it qualifies is printed with it.

    Raises:
        ReportError: a finding whose id names no prediction or claim of the plan.
    """
    ids = {r["id"] for r in result["predictions"]} | {c["claim"] for c in result["claims"]}
    unknown = sorted(set(findings) - ids)
    if unknown:
        raise ReportError(
            f"--findings: {', '.join(unknown)} name no prediction or claim of the plan "
            f"(it has: {', '.join(sorted(ids))})"
        )
    for r in result["predictions"]:
        if r["id"] in findings:
            r["finding"] = findings[r["id"]]
    for c in result["claims"]:
        source = c["detail"].removeprefix("prediction ")
        text = findings.get(c["claim"]) or findings.get(source)
        if text:
            c["finding"] = text


def _too_few(seeds: dict[str, int]) -> str:
    """Says why a comparison has no test: its sides' finished seeds (a test needs 2 on each)."""
    return "too few finished seeds: " + ", ".join(f"{label} {n}" for label, n in seeds.items())


def _holm_some(ps: list[float | None]) -> list[float | None]:
    """Returns the Holm-adjusted p-values of those that exist; None stays None."""
    real = [p for p in ps if p is not None]
    adjusted = iter(stats.holm(real))
    return [None if p is None else next(adjusted) for p in ps]


def _row(
    p: Planned,
    t: stats.Test | None,
    seeds: dict[str, int],
    own: float | None,
    adjusted: float | None,
    verdict: str,
    moved: bool,
    note: str | None,
    two_sided_holm: float | None = None,
) -> dict[str, Any]:
    return {
        "id": p.id,
        "family": p.family,
        "comparison": _comparison(p),
        "measure": p.measure,
        "window": p.window,
        "expect": p.expect,
        "margin": p.margin,
        "paper": p.paper,
        "counts_for": p.counts_for,
        "seeds": seeds,
        "test": None if t is None else t.name,
        "n": None if t is None else t.n,
        "difference": None if t is None else t.difference,
        "ci95": None if t is None else t.ci95,
        "ci90": None if t is None else t.ci90,
        "p": None if t is None else t.p,
        "sign_flip_p": None if t is None else t.sign_flip_p,
        "p_tested": own,
        "holm_p": adjusted,
        "holm_p_two_sided": two_sided_holm,
        "verdict": verdict,
        "paper_direction": moved,
        "note": note,
    }


def _comparison(p: Planned) -> str:
    if len(p.terms) == 2 and p.terms[0][1] == 1 and p.terms[1][1] == -1:
        return f"{p.terms[0][0]} − {p.terms[1][0]}"
    return " ".join(
        f"{'+' if c > 0 else '−'}{'' if abs(c) == 1 else f'{abs(c):g}·'}({label})"
        for label, c in p.terms
    )


def _claim(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Returns a claim "VAPO above <preset>", read from its row's first plateau-score prediction."""
    preset = {"vapo_above_dapo": "dapo", "vapo_above_ppo": "ppo"}.get(name)
    label = row_name(preset) if preset else name
    r = next(
        (
            r
            for r in results
            if r["measure"] == "plateau_score" and r["comparison"].startswith(f"{label} − ")
        ),
        None,
    )
    if r is None:
        return {
            "claim": name,
            "verdict": "not determinable",
            "detail": "no plateau-score prediction of that row",
        }
    return {
        "claim": name,
        "text": f"VAPO scores above {label}",
        "verdict": r["verdict"] if r["expect"] == "lower" else "not pre-registered as lower",
        "detail": f"prediction {r['id']}",
    }


def plateau_check(vapo: list[RunData], key: str) -> dict[str, Any]:
    """Returns VAPO's seed-mean held-out curve over the last ``PLATEAU_FRACTION`` of the steps and
    whether it stays within ``PLATEAU_TOLERANCE`` points: the pre-registered plateau rule."""
    runs = [r for r in vapo if r.status == "FINISHED" and r.history.get(key)]
    if not runs:
        return {"flat": None, "points": {}}
    common = set.intersection(*({s for s, _ in r.history[key]} for r in runs))
    last = max(common)
    tail = sorted(s for s in common if s >= last - PLATEAU_FRACTION * last)
    means = {s: 100 * sum(dict(r.history[key])[s] for r in runs) / len(runs) for s in tail}
    spread = max(means.values()) - min(means.values())
    return {
        "flat": spread <= PLATEAU_TOLERANCE,
        "points": means,
        "spread": spread,
        "seeds": len(runs),
    }


def _plateau_rows(groups: Groups, key: str) -> dict[str, dict[str, Any]]:
    """Returns the plateau rule read for every row of one grid: {variant: plateau_check}."""
    return {v: plateau_check(runs, key) for v, runs in sorted(groups.items())}


def _rank(groups: Groups, key: str) -> dict[str, Any]:
    """Returns Spearman ρ and Kendall τ-b of the plateau means against the paper's, with CIs."""
    paper = paper_scores()
    rows = {
        v: list(per_seed(groups.get(v, []), "plateau_score", "all", key).values()) for v in paper
    }
    rows = {v: s for v, s in rows.items() if s}
    if len(rows) < 2:
        return {"n": len(rows)}
    rho, tau = stats.rank_correlations(
        [sum(s) / len(s) for s in rows.values()], [paper[v] for v in rows]
    )
    ci = stats.rank_interval(list(rows.values()), [paper[v] for v in rows]) or {}
    return {
        "n": len(rows),
        "spearman": rho,
        "kendall": tau,
        "spearman_ci": ci.get("spearman"),
        "kendall_ci": ci.get("kendall"),
    }
