"""Grids: a YAML file of cells (preset + dropped components + overrides) x seeds -> run specs.

A grid file (``experiments/table1.yaml`` is the paper's Table 1)::

    name: table1                      # also the MLflow experiment, unless `experiment:` is given
    seeds: [0]                        # --seeds N replaces it with 0..N-1
    overrides: [trainer.total_steps=80]   # applied to every cell
    sweep: {trainer.actor_lr: "1e-5,3e-5"}  # Hydra sweep syntax: the grid is multiplied by it
    cells:
      - {name: ppo, algo: ppo}
      - {name: vapo-no-clip_higher, algo: vapo, drop: [clip_higher], overrides: [loss.eps_high=0.2]}

Every cell x seed x sweep point is one run, identified by the hash of its fully composed config
(seed included, output locations and tracking left out): re-running the same grid finds the same
runs, so finished ones are skipped and partial ones resumed. The grid id hashes the cells' configs
without the seed, so running a grid again with more seeds extends it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from vapo_lab.errors import ConfigError
from vapo_lab.names import check_name, slug
from vapo_lab.registry import table1

# `cells: table1` in a grid file: the cells are Table 1's rows (vapo_lab.registry.table1)
TABLE1_CELLS = "table1"
# the most runs one grid may have (cells x sweep points x seeds): its --dry-run takes ~10 s at
# this size (docs/benchmarks.md, "Grid expansion"); a larger grid is refused before it is composed
MAX_RUNS = 10_000
# config keys that say where a run is written or logged, not what it computes
VOLATILE_KEYS = ("output_dir", "run_name", "resume", "tracking", "launcher")


@dataclass
class CellSpec:
    """One run of a grid: everything a launcher needs to start (or resume) it, JSON-serialisable
    (it crosses into worker processes, Ray tasks and Slurm jobs)."""

    grid_id: str
    name: str  # the grid file's cell name, e.g. vapo-no-clip_higher
    algo: str
    drop: list[str]
    overrides: list[str]  # the cell's own: grid + cell + sweep point + seed (not output/tracking)
    seed: int
    config_hash: str
    key: str  # <name>-s<seed>[-<sweep>]-<hash8>: the run's folder name
    sweep: dict[str, str] = field(default_factory=dict)
    # the composed config, resolved (its hash is config_hash), and the Hydra group choices it was
    # composed with: the cell's job runs this, with only where it writes and logs set
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    choices: dict[str, str] = field(default_factory=dict, repr=False)

    def to_record(self) -> dict[str, Any]:
        """Returns the cell as the grid's record lists it: how it was made, not its whole config
        (its run folder's config.yaml holds that)."""
        return {k: v for k, v in asdict(self).items() if k not in ("config", "choices")}


@dataclass
class Grid:
    """A grid file, loaded and checked."""

    name: str
    experiment: str
    seeds: list[int]
    overrides: list[str]
    sweep: dict[str, str]
    cells: list[dict[str, Any]]
    source: str  # the file it came from

    def expand(self, extra_overrides: Sequence[str] = ()) -> list[CellSpec]:
        """Returns every run of the grid (cells x sweep points x seeds), each composed (once: its
        ``config`` is what its job runs) and validated.

        Raises:
            ConfigError: a cell whose config does not compose (named, with the reason).
        """
        from vapo_lab.config.batch import BatchComposer

        check_size(self.name, len(self.cells), sweep_sizes(self.sweep), len(self.seeds))
        composer = BatchComposer()  # Hydra once per structure: 10,000 cells in seconds
        specs: list[CellSpec] = []
        cell_hashes: set[str] = set()  # without the seed: more seeds extend the same grid
        points = sweep_points(self.sweep)
        for cell in self.cells:
            for point in points:
                for seed in self.seeds:
                    ov = [
                        *self.overrides,
                        *cell.get("overrides", []),
                        *extra_overrides,
                        *(f"{k}={v}" for k, v in point.items()),
                        f"seed={seed}",
                    ]
                    try:
                        resolved, choices = composer.compose(cell["algo"], cell.get("drop", []), ov)
                    except ConfigError as e:
                        raise ConfigError(
                            f"grid {self.name}, cell {cell['name']} (seed {seed}): {e}"
                        ) from e
                    h = config_hash(resolved)
                    cell_hashes.add(config_hash({k: v for k, v in resolved.items() if k != "seed"}))
                    label = "".join(
                        f"-{_slug(k.split('.')[-1])}{_slug(v)}" for k, v in point.items()
                    )
                    specs.append(
                        CellSpec(
                            grid_id="",
                            name=cell["name"],
                            algo=cell["algo"],
                            drop=list(cell.get("drop", [])),
                            overrides=ov,
                            seed=seed,
                            config_hash=h,
                            key=f"{cell['name']}{label}-s{seed}-{h[:8]}",
                            sweep=dict(point),
                            config=resolved,
                            choices=choices,
                        )
                    )
        seen: dict[str, str] = {}
        for s in specs:
            if s.config_hash in seen:
                raise ConfigError(
                    f"grid {self.name}: cells {seen[s.config_hash]} and {s.key} compose the same "
                    "config: remove one of them (or give them different overrides)"
                )
            seen[s.config_hash] = s.key
        # the grid id names the cells (config without seed): `--seeds 3` after `--seeds 1` reopens
        # the same grid folder, skips seed 0's finished runs and adds seeds 1 and 2
        gid = (
            f"{_slug(self.name)}-"
            f"{hashlib.sha256(''.join(sorted(cell_hashes)).encode()).hexdigest()[:8]}"
        )
        for s in specs:
            s.grid_id = gid
        return specs


def config_hash(cfg: dict[str, Any]) -> str:
    """Returns the hash that identifies a run: its resolved config without output/tracking keys."""
    kept = {k: v for k, v in cfg.items() if k not in VOLATILE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sweep_points(sweep: dict[str, str]) -> list[dict[str, str]]:
    """Returns the cartesian product of Hydra sweep values.

    E.g. {"a": "1,2"} -> [{"a": "1"}, {"a": "2"}]. Each value is Hydra override syntax
    (``1,2,3``, ``range(0,3)``, ``choice(a,b)``); ``glob(*)`` is not supported (no choices to glob
    over here).

    Raises:
        ConfigError: a value that is not sweep syntax, or a grid over ``MAX_RUNS`` runs.
    """
    axes = [[(key, v) for v in values] for key, values in _axes(sweep).items()]
    check_size("sweep", 1, [len(a) for a in axes], 1)
    return [dict(combo) for combo in itertools.product(*axes)]


def sweep_sizes(sweep: dict[str, str]) -> list[int]:
    """Returns how many values each axis of ``sweep`` has (an axis past ``MAX_RUNS`` counts
    ``MAX_RUNS + 1``: it is read no further)."""
    return [len(v) for v in _axes(sweep).values()]


def _axes(sweep: dict[str, str]) -> dict[str, list[str]]:
    """Returns each axis's values, read no further than ``MAX_RUNS + 1`` (``range(0,10**9)`` is
    refused in a moment, not listed)."""
    if not sweep:
        return {}
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    axes: dict[str, list[str]] = {}
    for key, value in sweep.items():
        text = f"{key}={value}"
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as e:
            raise ConfigError(
                f"sweep {text!r} is not Hydra sweep syntax ({str(e).splitlines()[0]}): "
                "write e.g. trainer.actor_lr: 1e-5,3e-5 or range(0,3)"
            ) from e
        axes[key] = (
            list(itertools.islice(ov.sweep_string_iterator(), MAX_RUNS + 1))
            if ov.is_sweep_override()
            else [ov.get_value_element_as_str()]
        )
    return axes


def check_size(name: str, cells: int, axes: Sequence[int], seeds: int) -> None:
    """Raises ConfigError when a grid of ``cells`` x the sweep's axes x ``seeds`` runs is over
    ``MAX_RUNS``, before anything of it is composed."""
    runs = cells * seeds
    for n in axes:
        runs *= n
    if runs > MAX_RUNS:
        shape = " x ".join(
            [f"{cells} cell(s)", *(f"{n} sweep value(s)" for n in axes), f"{seeds} seed(s)"]
        )
        raise ConfigError(
            f"grid {name}: {shape} = {runs:,} runs, over the cap of {MAX_RUNS:,} a grid: split it "
            "into several grid files, or give fewer seeds or sweep values"
        )


def _slug(text: Any) -> str:
    return slug(text)


def builtin_grids() -> dict[str, Path]:
    """Returns {name: path} of the grid files shipped in experiments/ (as vapo_lab.experiments)."""
    root = Path(str(resources.files("vapo_lab.experiments")))
    return {p.stem: p for p in sorted(root.glob("*.yaml"))}


def load_grid(path_or_name: str | Path, seeds: int | None = None) -> Grid:
    """Returns the grid in a YAML file, or a shipped one by name (e.g. ``table1``), with seeds
    0..``seeds``-1 instead of the file's when ``seeds`` is given.

    Raises:
        ConfigError: missing file, bad YAML, or a malformed grid (named, with the fix).
    """
    path = Path(path_or_name)
    if not path.is_file():
        shipped = builtin_grids()
        if str(path_or_name) in shipped:
            path = shipped[str(path_or_name)]
        else:
            raise ConfigError(
                f"grid file {path_or_name} not found: give a YAML file or one of "
                f"{', '.join(shipped) or '(none shipped)'}"
            )
    raw = yaml_file(path, "grid file")
    if isinstance(raw, dict) and raw.get("cells") == TABLE1_CELLS:
        raw = {**raw, "cells": table1_cells()}
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) or not raw["cells"]:
        raise ConfigError(
            f"grid file {path}: needs a non-empty list `cells:` of "
            "{name, algo, drop, overrides}, "
            f"or `cells: {TABLE1_CELLS}` for the paper's Table 1"
        )
    unknown = set(raw) - {
        "name",
        "experiment",
        "description",
        "seeds",
        "overrides",
        "sweep",
        "cells",
    }
    if unknown:
        raise ConfigError(
            f"grid file {path}: unknown keys {sorted(unknown)} (allowed: name, experiment, "
            "description, seeds, overrides, sweep, cells)"
        )
    name = str(raw.get("name") or path.stem)
    cells = []
    names: set[str] = set()
    for i, cell in enumerate(raw["cells"]):
        if not isinstance(cell, dict) or "name" not in cell:
            raise ConfigError(
                f"grid file {path}: cell {i + 1} needs a `name:` (and `algo:`, optional "
                "`drop:` and `overrides:` lists)"
            )
        extra = set(cell) - {"name", "algo", "drop", "overrides"}
        if extra:
            raise ConfigError(
                f"grid file {path}: cell {cell['name']} has unknown keys {sorted(extra)}"
            )
        try:
            check_name(str(cell["name"]), f"grid file {path}: cell name")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if cell["name"] in names:
            raise ConfigError(
                f"grid file {path}: two cells are named {cell['name']}: names must be unique"
            )
        names.add(cell["name"])
        for key in ("drop", "overrides"):
            if not isinstance(cell.get(key, []), list):
                raise ConfigError(f"grid file {path}: cell {cell['name']}: `{key}` must be a list")
            _scalars(cell.get(key, []), f"grid file {path}: cell {cell['name']}: `{key}`")
        cells.append(
            {
                "name": str(cell["name"]),
                "algo": str(cell.get("algo", "vapo")),
                "drop": [str(d) for d in cell.get("drop", [])],
                "overrides": [str(o) for o in cell.get("overrides", [])],
            }
        )
    file_seeds = raw.get("seeds", [0])
    if seeds is not None:
        check_seeds(seeds)
        check_size(name, len(cells), [], seeds)  # before range(seeds) is listed
        file_seeds = list(range(seeds))
    if (
        not isinstance(file_seeds, list)
        or not all(isinstance(s, int) for s in file_seeds)
        or not file_seeds
    ):
        raise ConfigError(f"grid file {path}: `seeds` must be a non-empty list of integers")
    sweep = raw.get("sweep") or {}
    if not isinstance(sweep, dict):
        raise ConfigError(f"grid file {path}: `sweep` must map config keys to Hydra sweep values")
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list):
        raise ConfigError(f"grid file {path}: `overrides` must be a list")
    _scalars(overrides, f"grid file {path}: `overrides`")
    for key, value in sweep.items():
        _scalars([key, value], f"grid file {path}: `sweep` entry {str(key)[:40]!r}")
    sweep = {str(k): str(v) for k, v in sweep.items()}
    check_size(name, len(cells), sweep_sizes(sweep), len(file_seeds))
    return Grid(
        name=name,
        experiment=str(raw.get("experiment") or name),
        seeds=list(file_seeds),
        overrides=[str(o) for o in overrides],
        sweep=sweep,
        cells=cells,
        source=str(path),
    )


def _scalars(values: list[Any], what: str) -> None:
    """Raises ConfigError unless every value is a string, number or bool: anything else (a list,
    a mapping, a YAML alias bomb of nested lists) is refused before ``str()`` could expand it."""
    bad = next((v for v in values if not isinstance(v, (str, int, float, bool))), None)
    if bad is not None:
        raise ConfigError(
            f"{what}: holds a {type(bad).__name__}, not a string: write each override as one "
            "string such as key=value"
        )


def table1_cells() -> list[dict[str, Any]]:
    """Returns the cells of the paper's Table 1 grid, one per row of the registries' Table 1."""
    return [
        {"name": r.cell, "algo": r.algo, **({"drop": list(r.drop)} if r.drop else {})}
        for r in table1.cells()
    ]


def check_seeds(seeds: int) -> None:
    """Raises ConfigError unless ``--seeds N`` asks for at least one seed (seeds 0..N-1)."""
    if seeds < 1:
        raise ConfigError(
            f"--seeds {seeds}: a grid runs seeds 0..N-1, so N must be >= 1; give --seeds 1 or "
            "more, or leave --seeds out"
        )


def yaml_file(path: Path, what: str) -> Any:
    """Returns the YAML document in ``path``; raises ConfigError naming the file and line of a byte
    that is not UTF-8 or of a YAML error."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(
            f"{what} {path}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at column {column}); "
            "save it as UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is None:
            raise ConfigError(
                f"{what} {path}: not valid YAML ({str(e).splitlines()[0]}); fix it"
            ) from None
        problem = getattr(e, "problem", None) or "a syntax error"
        context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
        where = (
            f", {context} that starts on line {start.line + 1}"
            if context and start and start.line != mark.line
            else (f", {context}" if context else "")
        )
        raise ConfigError(
            f"{what} {path}:{mark.line + 1}: not valid YAML ({problem} at column {mark.column + 1}"
            f"{where}); fix that line"
        ) from None


def drop_grid(drops: Sequence[str], seeds: int = 1) -> Grid:
    """Returns the one-variant grid of ``ablate --drop A [--drop B]``: VAPO without them."""
    check_seeds(seeds)
    check_size("ablate", 1, [], seeds)
    name = "vapo-no-" + "-".join(drops)
    return Grid(
        name="ablate",
        experiment="ablate",
        seeds=list(range(seeds)),
        overrides=[],
        sweep={},
        cells=[{"name": name, "algo": "vapo", "drop": list(drops), "overrides": []}],
        source="--drop " + " --drop ".join(drops),
    )
