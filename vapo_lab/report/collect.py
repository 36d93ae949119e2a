"""Reads a grid's runs from MLflow and groups them into the paper's variants (rows of Table 1).

Only MLflow is read (the local store or a server): a report can be made on any machine that sees
the tracking store, with no access to run folders. A run's variant comes from its tags — ``algo``
and ``components_off`` — written by the trainer: VAPO with every component is "VAPO", VAPO with
one component off is "w/o <component>", PPO with every component off is "Vanilla PPO".
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from vapo_lab.errors import VapoLabError
from vapo_lab.registry.components import COMPONENTS
from vapo_lab.registry.presets import PRESETS
from vapo_lab.registry.table1 import ABLATED
from vapo_lab.track.export import SOURCE_TAG


class ReportError(VapoLabError):
    """Nothing to report, or the tracking store cannot be read."""


@dataclass
class RunData:
    """One run as the report sees it."""

    run_id: str
    variant: str
    seed: int
    status: str  # MLflow: RUNNING, FINISHED, FAILED, KILLED
    tags: dict[str, str]
    # metric -> [(step, value)]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # the few config values the report draws with
    params: dict[str, str] = field(default_factory=dict)

    def last_step(self) -> int:
        return max((s for h in self.history.values() for s, _ in h), default=0)


CURVE_METRICS = ("rollout/response_length", "rollout/reward", "actor/entropy", "rollout/accuracy")
# metric families read whole: held-out scores, the trainer's diagnostics (value bias by position,
# length profile) and λ_policy statistics
PREFIXES = ("eval/", "diag/", "gae/")
CLIP_KEYS = ("actor/clipfrac_low", "actor/clipfrac_high")  # read for the index's clip table
RUN_NAME_TAG = "mlflow.runName"  # MLflow's tag of a run's name
# the fix for a missing experiment: an experiment is named after the grid whose runs it holds
RUN_FIRST = "run its grid first: vapo-lab sweep <its grid file>, or vapo-lab ablate --table1"
PARAMS = ("gae.alpha", "gae.lam_policy", "gae.lam_policy_mode", "rollout.max_new_tokens")


def variant_of(tags: dict[str, str]) -> str:
    """Returns the Table 1 row of a run from its tags, e.g. "w/o clip_higher", "VAPO w/o a, b"."""
    algo = tags.get("algo", "?")
    off = sorted(x for x in tags.get("components_off", "none").split(",") if x and x != "none")
    preset = PRESETS.get(algo) if algo in PRESETS else None
    # the components the run had (the trainer tags each one's state): a component registered
    # after the run was logged is not one it lacks
    known = {k.split(".", 1)[1] for k in tags if k.startswith("component.")} or set(
        COMPONENTS.names()
    )
    preset_off = set(preset.off()) & known if preset else set()
    extra = sorted(set(off) - preset_off)
    back_on = sorted(preset_off - set(off))
    if preset is None:
        name = algo.upper()
    elif not extra and not back_on:
        return preset.table1_row
    else:
        name = preset.label
    if algo == ABLATED and len(extra) == 1 and not back_on:
        return COMPONENTS.get(extra[0]).row
    parts = (
        [name]
        + ([f"w/o {', '.join(extra)}"] if extra else [])
        + ([f"with {', '.join(back_on)}"] if back_on else [])
    )
    return " ".join(parts)


@dataclass(frozen=True)
class Found:
    """A run as a source holds it (an MLflow store or a runs export), before the report reads it."""

    run_id: str
    status: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: frozenset[str]  # the keys it logged
    points: Callable[[str], Iterable[tuple[int, int, float]]]  # key -> [(step, timestamp, value)]


def load_runs(
    tracking_uri: str | None, experiment: str, metrics: tuple[str, ...] = ()
) -> list[RunData]:
    """Returns the cell runs of ``experiment`` (no grid parent runs) with their metric histories.

    The histories are those of ``metrics`` and of every metric under ``PREFIXES``.

    Raises:
        ReportError: no such store (a local one is never created), no such experiment, or no runs
            in it (naming `vapo-lab ablate`).
    """
    from vapo_lab.config.preflight import require, tracking_problems
    from vapo_lab.track import open_client, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    # a store that is not there is named, never created empty by MLflow
    require(tracking_problems(tracking_uri, key="--tracking-uri", must_exist=True), ReportError)
    client = open_client(uri)  # under the store's lock, as every opener
    try:
        exp = client.get_experiment_by_name(experiment)
    except Exception as e:  # noqa: BLE001 - one line, whatever the store says
        raise ReportError(
            f"cannot read the tracking store {uri}: {str(e).splitlines()[0][:200]}"
        ) from e
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise ReportError(
            f"no experiment {experiment!r} in {uri} (there: {', '.join(names) or 'none'}); "
            + RUN_FIRST
        )

    def points(run_id: str) -> Callable[[str], Iterable[tuple[int, int, float]]]:
        return lambda key: (
            (m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)
        )

    found = [  # MLflow's order: the latest start first
        Found(
            r.info.run_id,
            r.info.status,
            r.info.start_time or 0,
            dict(r.data.tags),
            dict(r.data.params),
            frozenset(r.data.metrics),
            points(r.info.run_id),
        )
        for r in client.search_runs([exp.experiment_id], max_results=10000)
    ]
    return read_runs(found, experiment, uri, metrics)


def runs_of_export(
    data: list[dict[str, Any]], experiment: str, where: str, metrics: tuple[str, ...] = ()
) -> list[RunData]:
    """Returns the cell runs of ``experiment`` in runs exports (``vapo_lab.track.export``'s
    ``read_export``, checked), read as ``load_runs`` reads them once imported into a store: the
    same runs in MLflow's order (the latest start first; a tie, random there, by the original run
    id here), each metric point as MLflow stores it (±inf at the largest float) and returns it
    (by step, timestamp, value).

    Raises:
        ReportError: no such experiment in the exports (``where`` names them), or no runs in it.
    """
    names = {d["experiment"] for d in data}
    if experiment not in names:
        raise ReportError(
            f"no experiment {experiment!r} in {where} (there: {', '.join(sorted(names))}); "
            + RUN_FIRST
        )
    runs = [r for d in data if d["experiment"] == experiment for r in d["runs"]]

    def points(run: dict[str, Any]) -> Callable[[str], Iterable[tuple[int, int, float]]]:
        return lambda key: sorted(
            ((step, ts, _stored(value)) for step, ts, value in run["metrics"][key]),
            key=_mlflow_order,
        )

    found = [
        Found(
            run["run_id"],
            run["status"],
            run["start_time"] or 0,
            _imported_tags(run),
            {k: str(v) for k, v in run["params"].items()},
            frozenset(k for k, series in run["metrics"].items() if series),  # a store keeps no []
            points(run),
        )
        for run in sorted(runs, key=lambda r: (-(r["start_time"] or 0), r["run_id"]))
    ]
    return read_runs(found, experiment, where, metrics)


def _imported_tags(run: dict[str, Any]) -> dict[str, str]:
    """A run's tags as ``import_runs`` leaves them in a store: its source id added and, where no
    tag names it, its run name as ``mlflow.runName`` (MLflow's create_run; a nameless run gets a
    random name there, none here)."""
    tags = {**run["tags"], SOURCE_TAG: run["tags"].get(SOURCE_TAG, run["run_id"])}
    if run["run_name"] and RUN_NAME_TAG not in tags:
        tags[RUN_NAME_TAG] = run["run_name"]
    return tags


def _mlflow_order(point: tuple[int, int, float]) -> tuple[int, int, float, bool]:
    """MLflow's order of a metric's history: step, timestamp, value (a NaN kept as 0), is NaN."""
    step, ts, value = point
    nan = math.isnan(value)
    return step, ts, 0.0 if nan else value, nan


def _stored(value: float) -> float:
    """A metric value as MLflow's SQL store keeps it: a float, ±inf as the largest finite one."""
    value = float(value)
    return math.copysign(sys.float_info.max, value) if math.isinf(value) else value


def read_runs(
    found: list[Found], experiment: str, where: str, metrics: tuple[str, ...] = ()
) -> list[RunData]:
    """Returns the training runs of ``found`` (one per config, ``_one_per_config``) as the report
    sees them; ``where`` names their source in the error.

    Raises:
        ReportError: no training run.
    """
    commands = sorted(  # the submissions that made the grid
        {
            r.params["command"]
            for r in found
            if r.tags.get("kind") == "grid" and r.params.get("command")
        }
    )
    runs = []
    for r in _one_per_config(found):
        tags = dict(r.tags)
        wanted = set(metrics) | {k for k in r.metrics if k.startswith(PREFIXES)}
        history = {key: last_per_step(r.points(key)) for key in sorted(wanted & r.metrics)}
        tags["grid_commands"] = " ; ".join(commands)
        runs.append(
            RunData(
                run_id=tags.get(SOURCE_TAG, r.run_id),  # an imported run keeps its original id
                variant=variant_of(tags),
                seed=int(tags.get("seed", 0)),
                status=r.status,
                tags=tags,
                history=history,
                params={k: r.params[k] for k in PARAMS if k in r.params},
            )
        )
    if not runs:
        raise ReportError(
            f"experiment {experiment!r} in {where} has no training runs yet: " + RUN_FIRST
        )
    return runs


def last_per_step(points: Iterable[tuple[int, int, float]]) -> list[tuple[int, float]]:
    """Returns [(step, value)] of [(step, timestamp, value)]; a step logged twice keeps its last."""
    by_step: dict[int, float] = {}
    for step, _, value in sorted(points, key=lambda p: (p[0], p[1])):
        by_step[int(step)] = float(value)
    return sorted(by_step.items())


def _one_per_config(found: list[Found]) -> list[Found]:
    """Returns the training runs, one per config hash: its latest finished run, else its latest."""
    best: dict[str, Found] = {}
    for r in found:
        if r.tags.get("kind") == "grid" or "algo" not in r.tags:
            continue
        key = r.tags.get("config_hash") or r.run_id
        rank = (r.status == "FINISHED", r.start_time)
        if key not in best or rank > (best[key].status == "FINISHED", best[key].start_time):
            best[key] = r
    return list(best.values())


def score_key(runs: list[RunData]) -> str:
    """Returns the held-out score metric the runs share, ``eval/avg_at_<k>`` (the largest k)."""
    keys = {k for r in runs for k in r.history if k.startswith("eval/avg_at_")}
    if not keys:
        raise ReportError(
            "no run has a held-out score (eval/avg_at_k) yet: runs log it every "
            "trainer.eval_every steps"
        )
    return max(keys, key=lambda k: int(k.rsplit("_", 1)[-1]))


def group(runs: list[RunData]) -> dict[str, list[RunData]]:
    out: dict[str, list[RunData]] = {}
    for r in sorted(runs, key=lambda r: (r.variant, r.seed)):
        out.setdefault(r.variant, []).append(r)
    return out
