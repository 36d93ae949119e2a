"""Scores pre-registered predictions against a grid's runs: confirmed, refuted or not separable.

A predictions file (YAML beside the prose it transcribes, e.g.
``reports/table1-cpu-long/predictions.yaml``) names, for a Table 1 row, a ``measure``
(``MEASURES``), the training ``window`` it is read over, the direction we ``expect`` against VAPO
(``lower``, ``higher`` or ``same``) and the one the ``paper`` argues. Each is scored by Table 1's
separability rule on the per-seed values, and so are two claims about the presets (the rule:
docs/report.md#predictions). Plans with ``families`` are scored by ``confirm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vapo_lab.registry.components import COMPONENTS
from vapo_lab.registry.presets import PRESETS
from vapo_lab.registry.table1 import ABLATED, row_name
from vapo_lab.report import precision, stats
from vapo_lab.report.collect import ReportError, RunData
from vapo_lab.report.diagnostics import (
    BIAS,
    GAP,
    LENGTH,
    bucket_start,
    buckets,
    in_window,
    windowed,
)
from vapo_lab.report.table import run_score

EARLY_TOKENS = 32  # "early tokens": the position buckets that start below 32 (0-7, 8-15, 16-31)
LONG_RESPONSE = 64  # "long responses": the length buckets that start at 64 tokens or more
WINDOWS = ("early", "late", "all")
DIRECTIONS = ("lower", "higher", "same")
CLAIMS = {
    "ppo_lowest": "Vanilla PPO has the lowest score of all rows",
    "vapo_above_dapo": "VAPO scores above DAPO",
}


def _window_mean(run: RunData, key: str, window: str) -> float | None:
    """Returns the mean of ``key`` over the steps of ``window`` at which it was logged, or None."""
    vals = windowed(run, key, window)
    return sum(vals) / len(vals) if vals else None


def _bucket_mean(run: RunData, prefix: str, window: str) -> float | None:
    """Returns the mean over the early-token buckets of each one's window mean (None if none)."""
    vals = [
        m
        for b in buckets([run], prefix)
        if b[0].isdigit()
        and bucket_start(b) < EARLY_TOKENS
        and (m := _window_mean(run, prefix + b, window)) is not None
    ]
    return sum(vals) / len(vals) if vals else None


def _abs_bias(run: RunData, window: str, score_key: str) -> float | None:
    m = _bucket_mean(run, BIAS, window)
    return None if m is None else abs(m)


def _gap(run: RunData, window: str, score_key: str) -> float | None:
    return _bucket_mean(run, GAP, window)


def _long_accuracy(run: RunData, window: str, score_key: str) -> float | None:
    """Returns the accuracy (x100) of the window's 64+-token training responses, count-weighted."""
    keep = in_window(run, window)
    count = correct = 0.0
    for b in (b for b in buckets([run], LENGTH + "count_") if bucket_start(b) >= LONG_RESPONSE):
        accs = dict(run.history.get(f"{LENGTH}acc_{b}", []))
        for s, n in run.history.get(f"{LENGTH}count_{b}", []):
            if s in keep and n > 0 and s in accs:
                count += n
                correct += n * accs[s]
    return 100 * correct / count if count else None


def _metric(key: str) -> Callable[[RunData, str, str], float | None]:
    return lambda run, window, score_key: _window_mean(run, key, window)


def _percent(key: str) -> Callable[[RunData, str, str], float | None]:
    """A share logged as a fraction, read as a percentage over the window."""

    def read(run: RunData, window: str, score_key: str) -> float | None:
        m = _window_mean(run, key, window)
        return None if m is None else 100 * m

    return read


@dataclass(frozen=True)
class Measure:
    text: str  # what it is, as the report prints it
    read: Callable[[RunData, str, str], float | None]  # (run, window, score key) -> value
    windowed: bool = True


MEASURES: dict[str, Measure] = {
    "score": Measure(
        "held-out score, final evaluation (x100)",
        lambda run, window, key: run_score(run, key, "final"),
        windowed=False,
    ),
    "value_bias_early_tokens_abs": Measure(
        "absolute value bias, mean V(s_t) − G_t over token positions 0-31", _abs_bias
    ),
    "adv_gap_early_tokens": Measure(
        "advantage of correct minus wrong 64+-token responses, positions 0-31", _gap
    ),
    "long_accuracy": Measure("accuracy of 64+-token training responses (x100)", _long_accuracy),
    "clipfrac_high": Measure(
        "fraction of tokens clipped high (ratio > 1+ε_high, A > 0)", _metric("actor/clipfrac_high")
    ),
    "entropy": Measure("actor entropy (nats a token)", _metric("actor/entropy")),
    # a task whose length is the policy's choice (task=arithfree): the held-out evaluations' modes
    "direct_share": Measure(
        "share of held-out responses answering directly, without a scratchpad (x100)",
        _percent("eval/mode_share_direct"),
    ),
    "eval_length": Measure(
        "mean held-out response length (tokens)", _metric("eval/response_length")
    ),
}


@dataclass(frozen=True)
class Prediction:
    id: str
    row: str  # a component (its row drops it from VAPO) or a preset
    measure: str
    window: str
    expect: str
    paper: str  # the direction the paper argues for the row against VAPO
    why: str = ""

    @property
    def variant(self) -> str:
        return row_name(self.row)


def load(path: str | Path) -> tuple[list[Prediction], list[str], str]:
    """Returns (predictions, preset claims, source) from a predictions YAML file.

    Raises:
        ReportError: a missing or malformed file, or an unknown row, measure, window or direction
            (one line naming the entry and the choices).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ReportError(
            f"--predictions {path}: no such file; give the YAML that lists the predictions "
            "(e.g. reports/table1-cpu-long/predictions.yaml)"
        )
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ReportError(
            f"--predictions {path}: not valid YAML ({str(e).splitlines()[0]}); fix the file"
        ) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("predictions"), list):
        raise ReportError(
            f"--predictions {path}: needs a 'predictions:' list of entries (id, row, measure, "
            "window, expect, paper)"
        )
    rows = set(COMPONENTS.names()) | set(PRESETS.names())
    out = []
    for i, e in enumerate(doc["predictions"]):
        where = f"--predictions {path}: entry {e.get('id', i) if isinstance(e, dict) else i}"
        if not isinstance(e, dict):
            raise ReportError(
                f"{where} is not a mapping; give id, row, measure, window, expect, paper"
            )
        missing = [k for k in ("id", "row", "measure", "expect", "paper") if k not in e]
        if missing:
            raise ReportError(f"{where} lacks {', '.join(missing)}")
        window = e.get("window", "all")
        for field, value, choices in (
            ("row", e["row"], sorted(rows)),
            ("measure", e["measure"], list(MEASURES)),
            ("window", window, list(WINDOWS)),
            ("expect", e["expect"], list(DIRECTIONS)),
            ("paper", e["paper"], list(DIRECTIONS)),
        ):
            if value not in choices:
                raise ReportError(
                    f"{where}: {field} {value!r} is not one of {', '.join(map(str, choices))}"
                )
        out.append(
            Prediction(
                str(e["id"]),
                e["row"],
                e["measure"],
                window,
                e["expect"],
                e["paper"],
                " ".join(str(e.get("why", "")).split()),
            )
        )
    claims = doc.get("claims", []) or []
    unknown = [c for c in claims if c not in CLAIMS]
    if unknown:
        raise ReportError(
            f"--predictions {path}: unknown claim(s) {', '.join(map(str, unknown))}; "
            f"choose from {', '.join(CLAIMS)}"
        )
    return out, list(claims), str(doc.get("source", ""))


def per_seed(runs: list[RunData], measure: str, window: str, score_key: str) -> list[float]:
    """Returns the measure of each finished run that has it."""
    read = MEASURES[measure].read
    return [
        v for r in runs if r.status == "FINISHED" and (v := read(r, window, score_key)) is not None
    ]


def verdict(expect: str, interval: tuple[float, float] | None) -> str:
    """Returns "confirmed", "refuted", "not separable" or "not determinable" (< 2 seeds a side)."""
    if interval is None:
        return "not determinable"
    sep = stats.separable(interval)
    if expect == "same":
        return "refuted" if sep else "confirmed"
    if not sep:
        return "not separable"
    lower = interval[1] < 0
    return "confirmed" if lower == (expect == "lower") else "refuted"


def _moved(paper: str, interval: tuple[float, float] | None) -> bool:
    """Returns whether the row moved separably in the paper's direction."""
    if interval is None or paper == "same" or not stats.separable(interval):
        return False
    return (interval[1] < 0) == (paper == "lower")


def score(
    predictions: list[Prediction],
    claims: list[str],
    groups: dict[str, list[RunData]],
    score_key: str,
) -> dict[str, Any]:
    """Returns {"predictions": [...], "claims": [...], "goal": {...}}: each prediction with both
    sides' per-seed values, the difference and its interval, the verdict and whether the row moved
    the paper's way; the goal's count of components that moved."""
    reference = row_name(ABLATED)
    ref_runs = groups.get(reference, [])
    scored = []
    for p in predictions:
        ours = per_seed(groups.get(p.variant, []), p.measure, p.window, score_key)
        ref = per_seed(ref_runs, p.measure, p.window, score_key)
        ci = stats.difference_interval(ours, ref)
        diff = sum(ours) / len(ours) - sum(ref) / len(ref) if ours and ref else None
        scored.append(
            {
                "id": p.id,
                "variant": p.variant,
                "row": p.row,
                "measure": p.measure,
                "window": p.window if MEASURES[p.measure].windowed else "final",
                "expect": p.expect,
                "paper": p.paper,
                "row_values": ours,
                "vapo_values": ref,
                "difference": diff,
                "interval": ci,
                "verdict": verdict(p.expect, ci),
                "paper_direction": _moved(p.paper, ci),
                "why": p.why,
            }
        )
    components = [c for c in COMPONENTS.names() if any(p.row == c for p in predictions)]
    moved = [c for c in components if any(s["paper_direction"] for s in scored if s["row"] == c)]
    return {
        "predictions": scored,
        "claims": [_claim(c, groups, score_key) for c in claims],
        "goal": {"components": components, "moved": moved},
    }


def _claim(name: str, groups: dict[str, list[RunData]], score_key: str) -> dict[str, Any]:
    scores = {v: per_seed(runs, "score", "all", score_key) for v, runs in groups.items()}
    scores = {v: s for v, s in scores.items() if s}
    if name == "vapo_above_dapo":
        vapo, dapo = scores.get(row_name(ABLATED), []), scores.get(row_name("dapo"), [])
        ci = stats.difference_interval(vapo, dapo)
        diff = sum(vapo) / len(vapo) - sum(dapo) / len(dapo) if vapo and dapo else None
        return {
            "claim": name,
            "text": CLAIMS[name],
            "verdict": verdict("higher", ci),
            "detail": f"VAPO − DAPO {_signed(diff)} {_ci(ci)}",
        }
    ppo = scores.get(row_name("ppo"), [])
    others = {v: s for v, s in scores.items() if v != row_name("ppo")}
    if not ppo or not others:
        return {
            "claim": name,
            "text": CLAIMS[name],
            "verdict": "not determinable",
            "detail": "no PPO or no other row",
        }
    mean = sum(ppo) / len(ppo)
    below = sorted(v for v, s in others.items() if sum(s) / len(s) <= mean)
    cis = {v: stats.difference_interval(ppo, s) for v, s in others.items()}
    sep_below = sorted(v for v, ci in cis.items() if ci is not None and ci[1] < 0)
    sep_above = sorted(v for v, ci in cis.items() if ci is not None and ci[0] > 0)
    # refuted when a row is separably below PPO; confirmed when PPO is separably below every row
    result = (
        "refuted"
        if sep_above
        else "confirmed"
        if len(sep_below) == len(others)
        else "not separable"
    )
    lowest = "yes" if not below else f"no ({', '.join(below)} at or below)"
    detail = (
        f"PPO mean {precision.fixed(mean, precision.SCORE)}; lowest mean: {lowest}; "
        f"separably below {len(sep_below)} of {len(others)} other rows"
    )
    if sep_above:
        detail += f"; separably above {', '.join(sep_above)}"
    return {"claim": name, "text": CLAIMS[name], "verdict": result, "detail": detail}


def _signed(v: float | None, digits: int = precision.SCORE) -> str:
    return "" if v is None else precision.fixed(v, digits, signed=True)


def _ci(ci: tuple[float, float] | None, digits: int = precision.SCORE) -> str:
    return (
        "(no interval)" if ci is None else f"[{_signed(ci[0], digits)}, {_signed(ci[1], digits)}]"
    )


def _digits(measure: str) -> int:
    """Returns the places a measure is written to: points for scores and accuracies,
    ``precision.FRACTION`` for clip fractions, ``precision.DIAGNOSTIC`` for the others."""
    if measure in ("score", "long_accuracy"):
        return precision.SCORE
    return precision.FRACTION if measure == "clipfrac_high" else precision.DIAGNOSTIC


def to_markdown(result: dict[str, Any], source: str = "") -> str:
    """Returns the scored predictions as Markdown: a table, the preset claims and the goal line."""
    lines = [
        "| # | row | measure (window) | expected vs VAPO | row − VAPO [95% interval] | verdict | "
        "moved the paper's way |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in result["predictions"]:
        d = _digits(s["measure"])
        window = f" ({s['window']} window)" if MEASURES[s["measure"]].windowed else ""
        lines.append(
            f"| {s['id']} | {s['variant']} | {MEASURES[s['measure']].text}{window} "
            f"| {s['expect']} | "
            f"{_signed(s['difference'], d)} {_ci(s['interval'], d)} | **{s['verdict']}** | "
            f"{'yes' if s['paper_direction'] else 'no'} |"
        )
    if result["claims"]:
        lines += ["", "| claim | verdict | detail |", "|---|---|---|"]
        lines += [f"| {c['text']} | **{c['verdict']}** | {c['detail']} |" for c in result["claims"]]
    g = result["goal"]
    counts = {
        v: sum(s["verdict"] == v for s in result["predictions"])
        for v in ("confirmed", "refuted", "not separable", "not determinable")
    }
    lines += [
        "",
        "Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".",
        f"Components whose row moved separably in the paper's direction on the score or a "
        f"mechanism diagnostic: {len(g['moved'])} of {len(g['components'])}"
        + (f" ({', '.join(g['moved'])})." if g["moved"] else "."),
    ]
    rule = (
        "Rule: per-seed values of the row against VAPO's; the 95% percentile-bootstrap interval "
        "of the difference of means (each side's seeds resampled on their own, as Table 1's "
        "separability); lower/higher: confirmed when the interval excludes 0 on the predicted "
        "side, refuted when on the other, else not separable; same: confirmed when it holds 0, "
        "refuted when not. Windows: early = first fifth of training steps, late = last fifth, all "
        "= every step."
    )
    lines += ["", rule + (f" Predictions from {source}." if source else "")]
    return "\n".join(lines) + "\n"
