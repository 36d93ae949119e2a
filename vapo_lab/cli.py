"""The `vapo-lab` command line: parse, compose the config, call one library function, print.

Only this module prints or exits. Library code raises ``VapoLabError`` subclasses; a command
prints their message (one line per problem) and exits 1, or shows the traceback with ``--debug``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vapo_lab import __version__
from vapo_lab.errors import ConfigError, VapoLabError

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    help="vapo-lab: reproduce, ablate and extend VAPO (value-model PPO for long chain-of-thought RL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Speed benchmarks that print ratios against a reference.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
base_app = typer.Typer(help="The embedded default's pre-trained base model.", no_args_is_help=True)
app.add_typer(base_app, name="base")

_state = {"debug": False}
_out = Console()
_err = Console(stderr=True)

OverridesArg = Annotated[
    Optional[list[str]],
    typer.Argument(help="Hydra overrides, e.g. loss.eps_low=0.1 scale=paper clip_higher=off.",
                   show_default=False),
]


def _cli_errors(fn: F) -> F:
    """Wraps a command so a VapoLabError prints as one line per problem and exits 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VapoLabError as e:
            if _state["debug"]:
                raise
            for line in str(e).splitlines() or [type(e).__name__]:
                _err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vapo-lab {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """vapo-lab: VAPO, PPO, DAPO and GRPO with every VAPO component a config toggle."""
    _state["debug"] = debug
    _quiet_libraries()


def _quiet_libraries() -> None:
    """Silences per-file progress bars and advisory warnings of transformers / huggingface_hub, and
    MLflow's informational lines."""
    import os

    # environment variables, read when transformers is first imported (later, and only by the
    # commands that need it); an import here would slow every command down
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not "Creating initial MLflow database tables..."
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@app.command()
@_cli_errors
def components() -> None:
    """List the seven VAPO components: what each does, its keys (on -> off) and Table 1 without it.

    Example: vapo-lab components
    """
    from vapo_lab.registry.components import COMPONENTS, settings
    from vapo_lab.registry.presets import PRESETS
    from vapo_lab.registry.table1 import paper_scores

    cols = (_Col("name", typed=True, style="bold"), _Col("keys: on -> off", typed=True), _Col("what it does (paper)"),
            _Col("Table 1 without it", justify="right"))
    rows = [(c.name, "\n".join(f"{k}: {_show(on)} -> {_show(off)}" for k, (on, off) in settings(c).items()),
             f"{c.summary} ({c.paper_section}, {c.origin})", f"{c.table1_without:g}") for c in COMPONENTS]
    paper = ", ".join(f"{row} = {score:g}" for row, score in paper_scores().items()
                      if row in {p.table1_row for p in PRESETS})
    _print_table(f"The {len(COMPONENTS)} VAPO components (Table 1: {paper})", cols, rows, lines=True)


@dataclass(frozen=True)
class _Col:
    """A column of :func:`_print_table`; ``typed``: its cells hold names, keys, ids or paths a user
    types, never cut and never broken inside a word."""

    header: str
    typed: bool = False
    justify: str = "left"
    style: str = ""


def _print_table(title: str | None, cols: Sequence[_Col], rows: Sequence[Sequence[str]], lines: bool = False) -> None:
    """Prints a title line and a table that keeps every typed cell whole.

    On a terminal: a rich table whose typed columns (and those of one word a cell) are as wide as
    their longest line, or else their longest word (a cell then wraps between words). Where even
    that does not fit, and whenever stdout is not a terminal (a pipe, a file): plain tab-separated
    lines, the header first, a cell's lines joined by '; ', for grep and cut.
    """
    if title:
        _out.print(title, markup=False, highlight=False, soft_wrap=True)
    if _out.is_terminal:
        cells = [[c.header for c in cols], *rows]
        longest = lambda i, split: max(cell_len(w) for r in cells for w in split(r[i]) or [""])  # noqa: E731
        words = [longest(i, str.split) for i in range(len(cols))]
        # fixed width: typed columns, and those of one word a cell (numbers): never squeezed by rich
        fixed = [col.typed or all(len(r[i].split()) <= 1 for r in rows) for i, col in enumerate(cols)]
        for split in (str.splitlines, str.split):  # fixed columns: whole lines, else whole words
            widths = [longest(i, split) if f else None for i, f in enumerate(fixed)]
            # narrowest table: each column its width or longest word, 1 space either side, a border between
            if sum((w or m) + 3 for w, m in zip(widths, words)) + 1 > _out.width:
                continue
            table = Table(show_lines=lines)
            for col, width in zip(cols, widths):
                table.add_column(col.header, justify=col.justify,  # type: ignore[arg-type]
                                 style=col.style, overflow="fold", width=width)
            for r in rows:
                table.add_row(*(Text(cell) for cell in r))
            _out.print(table)
            return
    plain = lambda cell: cell.replace("\t", " ").replace("\n", "; ")  # noqa: E731
    for r in [[c.header for c in cols], *rows]:
        _out.file.write("\t".join(plain(cell) for cell in r) + "\n")
    _out.file.flush()


def _show(value: Any) -> str:
    """Returns a config value as the user would type it (interpolations shown as '= key')."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return f"= {value[2:-1]}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@app.command()
@_cli_errors
def config(
    overrides: OverridesArg = None,
    algo: Annotated[Optional[str], typer.Option(help="Preset: vapo (default), ppo, dapo or grpo.")] = None,
    drop: Annotated[Optional[list[str]], typer.Option(
        help="Turn off a component of the preset (repeatable), e.g. --drop clip_higher.")] = None,
) -> None:
    """Print the fully composed config as YAML: the same composition `train` uses.

    Example: vapo-lab config --drop clip_higher loss.eps_low=0.1
    """
    from vapo_lab.config.compose import compose_config

    composed = compose_config(algo=algo, drop=drop or (), overrides=overrides or ())
    typer.echo(composed.to_yaml(), nl=False)


def _train(algo: str | None, drop: list[str], overrides: list[str], quiet: bool) -> None:
    """Composes the config, trains with a progress bar (plain lines in a log), prints the closing summary."""
    from rich.progress import TextColumn

    from vapo_lab.config.compose import compose_config
    from vapo_lab.progress import default_columns, progress_bar
    from vapo_lab.trainer.run import Run

    from vapo_lab.runs.folder import resume_config
    from vapo_lab.config.preflight import check_run
    from vapo_lab.integrity import CACHE_DIR

    composed = compose_config(algo=algo, drop=drop, overrides=overrides)
    cfg, choices = composed.cfg, composed.choices
    if cfg.resume:
        others = [o for o in overrides if not o.startswith("resume=")]
        if others or algo or drop:
            raise ConfigError(f"resume={cfg.resume} continues a run with its saved config: drop {others or '--algo/--drop'}")
        cfg, choices = resume_config(cfg.resume)
    check_run(cfg, CACHE_DIR)  # folders and tracking store, before the base build
    command = "vapo-lab " + " ".join(sys.argv[1:])
    _sigterm_interrupts()
    run = Run(cfg, choices, progress=None if quiet else lambda: progress_bar(
                  True, None, *default_columns(), TextColumn("{task.fields[info]}")),
              log=lambda msg: _err.print(msg, highlight=False),
              command=command)
    _err.print(f"run {run.run_dir} (tracking run {run.run_id}, {getattr(run.tracker, 'uri', 'none')})",
               highlight=False)
    total = int(cfg.trainer.total_steps)
    with progress_bar(not quiet, _err, *default_columns(), TextColumn("{task.fields[stats]}")) as bar:
        task = bar.add_task(f"{cfg.algo.name}", total=total, completed=run.step, stats="") if bar else None

        def on_step(step: int, m: dict[str, float]) -> None:
            if bar is None:
                return
            stats = (f"reward {m.get('rollout/reward', float('nan')):.3f} "
                     f"acc {m.get('rollout/accuracy', float('nan')):.3f} "
                     f"len {m.get('rollout/response_length', float('nan')):.0f}")
            bar.update(task, completed=step, stats=stats)

        result = run.run(on_step)
    k = int(cfg.rollout.eval_samples)
    fmt = lambda v: "n/a" if v is None else f"{100 * v:.1f}"  # noqa: E731
    _out.print(f"run id      {result.run_id}\n"
               f"run dir     {result.run_dir}\n"
               f"eval avg@{k}  base {fmt(result.base_eval)}  final {fmt(result.final_eval)}  "
               f"best {fmt(result.best_eval)}  (held-out, x100)\n"
               f"checkpoint  {result.checkpoint}\n"
               f"peak RSS    {_peak_rss_mib():.0f} MiB", highlight=False)


def _sigterm_interrupts() -> None:
    """Makes SIGTERM (``kill``, a container stop, Slurm's scancel) end the run as Ctrl-C does: the
    run is marked KILLED in MLflow and says so in its folder, instead of staying RUNNING."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _peak_rss_mib() -> float:
    """Returns this process's peak resident memory in MiB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@app.command()
@_cli_errors
def train(
    overrides: OverridesArg = None,
    algo: Annotated[Optional[str], typer.Option(help="Preset: vapo (default), ppo, dapo or grpo.")] = None,
    drop: Annotated[Optional[list[str]], typer.Option(help="Turn off a component of the preset (repeatable).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train one run (default: VAPO on the embedded default) and print where it went.

    Example: vapo-lab train --algo dapo trainer.total_steps=20 seed=1
    """
    _train(algo, drop or [], overrides or [], quiet)


LauncherOpt = Annotated[Optional[str], typer.Option(
    help="Where the runs go: local (this machine's processes), ray, or slurm (a job array via submitit). "
         "Settings: launcher.<name>.* overrides (conf/launcher/).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the cells (and Slurm's sbatch scripts); submit nothing.")]
WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="Slurm: wait until every cell ends (local and Ray always wait).")]


@app.command()
@_cli_errors
def ablate(
    overrides: OverridesArg = None,
    drop: Annotated[Optional[list[str]], typer.Option(help="Component to turn off (repeatable), e.g. --drop clip_higher.")] = None,
    table1: Annotated[bool, typer.Option("--table1", help="The whole Table 1 grid (experiments/table1.yaml): PPO, DAPO, VAPO and VAPO without each component.")] = False,
    seeds: Annotated[Optional[int], typer.Option(help="Seeds 0..N-1 of every cell (a grid).")] = None,
    launcher: LauncherOpt = None,
    dry_run: DryRunOpt = False,
    wait: WaitOpt = True,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar (single run).")] = False,
) -> None:
    """Train VAPO without the given components (one row of Table 1), or the whole Table 1 grid.

    Examples: vapo-lab ablate --drop clip_higher seed=2 ;
    vapo-lab ablate --table1 --seeds 3 --launcher slurm launcher.slurm.partition=gpu
    """
    from vapo_lab.launch.grid import check_seeds, drop_grid, load_grid

    if seeds is not None:
        check_seeds(seeds)
    if table1 and drop:
        raise ConfigError("--table1 already holds every --drop variant: give one or the other")
    if not table1 and not drop:
        raise ConfigError("give --drop NAME (repeatable) for one variant, or --table1 for the whole grid")
    if not table1 and seeds is None and launcher is None and not dry_run:
        _train("vapo", drop or [], overrides or [], quiet)  # one run, here, with a progress bar
        return
    grid = load_grid("table1", seeds=seeds) if table1 else drop_grid(drop or [], seeds=seeds or 1)
    _run_grid(grid, overrides or [], launcher, dry_run, wait)


def _run_grid(grid: Any, overrides: list[str], launcher: str | None, dry_run: bool, wait: bool) -> None:
    from vapo_lab.launch.commands import run_grid

    run_grid(grid, overrides, launcher, dry_run, wait, log=lambda m: _err.print(m, highlight=False),
             out=lambda m: _out.print(m, highlight=False, markup=False, soft_wrap=True))


@app.command()
@_cli_errors
def sweep(
    grid_file: Annotated[str, typer.Argument(help="A grid YAML file (see experiments/), or a shipped grid's name: table1, lr_sweep.")],
    overrides: OverridesArg = None,
    seeds: Annotated[Optional[int], typer.Option(help="Seeds 0..N-1 of every cell, instead of the file's.")] = None,
    launcher: LauncherOpt = None,
    dry_run: DryRunOpt = False,
    wait: WaitOpt = True,
) -> None:
    """Run a grid file: its cells x sweep points x seeds, skipping runs already finished.

    Example: vapo-lab sweep experiments/lr_sweep.yaml --launcher ray trainer.total_steps=20
    """
    from vapo_lab.launch.grid import load_grid

    _run_grid(load_grid(grid_file, seeds=seeds), overrides or [], launcher, dry_run, wait)


@app.command()
@_cli_errors
def jobs(
    grid: Annotated[Optional[str], typer.Argument(help="Grid id (or a prefix); default: the latest grid.")] = None,
    output_dir: Annotated[str, typer.Option(help="Where grids live (the runs' output_dir).")] = "runs",
) -> None:
    """List a grid's cells: state (pending, running step k, finished, failed with the error), job and run ids."""
    from vapo_lab.launch.commands import jobs_table

    path, rows = jobs_table(output_dir, grid)
    cols = (_Col("cell", typed=True), _Col("state"), _Col("job id", typed=True), _Col("tracking run id", typed=True))
    _print_table(f"grid {path.name} ({path})", cols, [(r["cell"], r["state"], r["job_id"], r["run_id"]) for r in rows])


@app.command()
@_cli_errors
def cancel(
    grid: Annotated[Optional[str], typer.Argument(help="Grid id (or a prefix); default: the latest grid.")] = None,
    output_dir: Annotated[str, typer.Option(help="Where grids live (the runs' output_dir).")] = "runs",
) -> None:
    """Cancel a grid's queued and running cells (scancel; SIGTERM for local / Ray cells on this host).

    Finished cells and checkpoints are kept: submitting the grid again resumes the rest.
    """
    from vapo_lab.launch.commands import cancel as cancel_grid

    path, done = cancel_grid(output_dir, grid)
    _out.print("\n".join(done) if done else f"nothing running in grid {path.name}", highlight=False)


@app.command()
@_cli_errors
def server(
    host: Annotated[str, typer.Option(help="Interface to bind; 127.0.0.1 keeps it private to this machine. "
                                          "Use 0.0.0.0 only on a trusted network (MLflow has no auth).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 5000,
    store: Annotated[str, typer.Option(help="Folder for the server's database and artifacts.")] = "mlflow-server",
) -> None:
    """Run an MLflow tracking server for grids on Slurm / Ray (runs log with tracking.uri=http://HOST:PORT)."""
    from vapo_lab.track.server import serve_forever

    serve_forever(host, port, store, log=lambda m: _err.print(m, highlight=False))


@app.command()
@_cli_errors
def report(
    experiment: Annotated[str, typer.Option(help="MLflow experiment of the grid (the grid file's name).")] = "table1",
    out: Annotated[Optional[str], typer.Option(help="Output folder (default reports/<experiment>).")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow store or server (default: MLFLOW_TRACKING_URI, else ./mlflow.db).")] = None,
    variants: Annotated[Optional[list[str]], typer.Option(help="Figure 2's variants (repeatable), default VAPO and DAPO.")] = None,
    score: Annotated[str, typer.Option(help="final (last evaluation, default) or best (highest evaluation).")] = "final",
    ema: Annotated[float, typer.Option(help="EMA smoothing of Figure 2 in (0, 1]; 1 = none.")] = 1.0,
    band: Annotated[str, typer.Option(help="Band around the mean over seeds: minmax or std.")] = "minmax",
    runs: Annotated[Optional[str], typer.Option(help="Report from a runs export (.json.gz) instead of a store.")] = None,
    save_runs: Annotated[Optional[str], typer.Option(help="Also export the experiment's runs to this .json.gz.")] = None,
) -> None:
    """Table 1 (Markdown, LaTeX, CSV), Figure 1, Figure 2 and diagnostics from a grid's tracked runs,
    beside the paper.

    Examples: vapo-lab report --experiment table1 --variants VAPO --variants DAPO --variants GRPO;
    vapo-lab report --runs reports/table1-20steps/runs.json.gz --out reports/table1-20steps
    """
    from vapo_lab.report import ReportError, make_report, report_from_export

    if runs and save_runs:
        raise ReportError("--runs and --save-runs together: a runs export is already saved; give one of them")
    if runs:
        rep = report_from_export(runs, out, variants=variants, score=score, smooth=ema, band=band)
    else:
        rep = make_report(experiment, out, tracking_uri, variants, score=score, smooth=ema, band=band)
    if save_runs:
        from vapo_lab.track import resolve_tracking_uri
        from vapo_lab.track.export import export_runs

        n = export_runs(resolve_tracking_uri(tracking_uri), experiment, save_runs)
        _out.print(f"exported {n} runs to {save_runs}", highlight=False)
    _out.print((rep.out / "table1.md").read_text(), highlight=False, markup=False)
    _out.print(f"wrote {len(rep.files)} files to {rep.out} (start with {rep.out / 'index.md'})", highlight=False)


@base_app.command("build")
@_cli_errors
def base_build(
    overrides: OverridesArg = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when cached.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Pre-train the tiny base model for this config (cached; `train` builds it on first use too)
    and print its held-out accuracy by digit count.

    Example: vapo-lab base build task.options.max_digits=20 +model.base.steps=400
    """
    from rich.progress import TextColumn

    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.preflight import require_writable
    from vapo_lab.basemodel import build_base_for
    from vapo_lab.integrity import CACHE_DIR
    from vapo_lab.progress import default_columns, progress_bar

    cfg = compose_config(overrides=overrides or ()).cfg
    require_writable(CACHE_DIR / "base", f"the base-model cache {CACHE_DIR / 'base'}",
                     "run vapo-lab from a writable folder")
    base = build_base_for(cfg, progress=None if quiet else lambda: progress_bar(
        True, None, *default_columns(), TextColumn("{task.fields[info]}")), force=force)
    m = base.metrics
    buckets = list(m["accuracy"]["t1"])
    cols = [_Col("held-out accuracy")] + [_Col("all digits" if b == "all" else f"{b} digits", justify="right")
                                          for b in buckets]
    rows = [(label, *(f"{100 * m['accuracy'][mode][b]:.1f}%" for b in buckets))
            for mode, label in (("t1", "temperature 1"), ("greedy", "greedy"))]
    _print_table(f"base model {'(cached) ' if base.cached else ''}{base.path}", cols, rows)
    _out.print(f"{m['n_params']:,} parameters; responses {m['response_tokens']['min']}-"
               f"{m['response_tokens']['max']} tokens; final loss {m['final_loss']}; "
               f"built in {m.get('build_seconds', m['train_seconds'] + m['eval_seconds'])} s", highlight=False)


@bench_app.command("gae")
@_cli_errors
def bench_gae(
    shapes: Annotated[str, typer.Option(help="Comma-separated BxT shapes.")] = "512x4096,8192x1024",
    repeats: Annotated[int, typer.Option(help="Timed repeats per shape (median reported).")] = 5,
    threads: Annotated[int, typer.Option(
        help="torch CPU threads for both implementations. 1 by default: the loop cannot use a second "
             "core, and multi-threaded ops stall when another process holds a core.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the random batch.")] = 0,
) -> None:
    """Time the vectorised GAE against a reverse-time loop over steps; print both and the ratio.

    Example: vapo-lab bench gae --shapes 512x4096 --repeats 3
    """
    from vapo_lab.bench.gae import format_gae_benchmark, parse_shapes, run_gae_benchmark

    rows = run_gae_benchmark(shapes=parse_shapes(shapes), repeats=repeats, seed=seed, threads=threads)
    typer.echo(format_gae_benchmark(rows))


@app.command("eval")
@_cli_errors
def eval_(
    bench: Annotated[Optional[str], typer.Argument(
        help="arith (the run's held-out task split), aime24, aime25, math500, gsm8k, or a JSONL path.",
        show_default=False)] = None,
    samples: Annotated[int, typer.Option("--samples", "-n", help="N samples per problem (avg@N).")] = 32,
    model: Annotated[Optional[str], typer.Option(
        help="A run directory or its MLflow run id (its latest checkpoint), a checkpoint folder, or a local HF "
             "model folder. Default: the latest run under --runs-dir.", show_default=False)] = None,
    step: Annotated[Optional[int], typer.Option(help="The run's checkpoint at this training step.",
                                                show_default=False)] = None,
    backend: Annotated[str, typer.Option(help="builtin (CPU/GPU) or vllm (GPU; needs vLLM, the gpu extra).")]
    = "builtin",
    temperature: Annotated[float, typer.Option(help="Sampling temperature (paper: 1.0).")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus mass (paper: 0.7).")] = 0.7,
    max_tokens: Annotated[Optional[int], typer.Option(
        help="New tokens per response. Default: arith the run's rollout.max_new_tokens, else 1024.",
        show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option(
        help="Sampling seed. Default: arith on a run the trainer's eval seed at that step, else 0.",
        show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option(
        help="Output folder (samples.jsonl, summary.json); rerun to resume. Default: <run>/eval/... or evals/...",
        show_default=False)] = None,
    per_problem: Annotated[bool, typer.Option("--per-problem", help="Print a table of every problem.")] = False,
    responses: Annotated[Optional[Path], typer.Option(
        help="Grade this JSONL of responses (problem_id, response) instead of generating.", show_default=False)] = None,
    data: Annotated[Optional[Path], typer.Option(help="A JSONL benchmark file instead of BENCH.",
                                                 show_default=False)] = None,
    problem_key: Annotated[Optional[str], typer.Option(help="--data: field of the problem text (default problem).",
                                                       show_default=False)] = None,
    answer_key: Annotated[Optional[str], typer.Option(help="--data: field of the reference (default answer).",
                                                      show_default=False)] = None,
    template: Annotated[Optional[str], typer.Option(
        help="Prompt template with {problem}. Default: the problem, then 'Please reason step by step, and put your "
             "final answer within \\boxed{}.'", show_default=False)] = None,
    chunk_problems: Annotated[Optional[int], typer.Option(
        help="Problems per generation chunk (the resume unit; each seeded from seed and its index). Default "
             "256 // N; 0: one chunk, which reproduces the trainer's eval draws.", show_default=False)] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads.", show_default=False)] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where runs are looked for.")] = Path("runs"),
    no_track: Annotated[bool, typer.Option("--no-track", help="Log nothing to MLflow.")] = False,
    tracking_uri: Annotated[Optional[str], typer.Option(
        help="MLflow store for a new eval run (default: $MLFLOW_TRACKING_URI, else ./mlflow.db).",
        show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Discard earlier samples in the output folder.")]
    = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Evaluate a model: N samples per problem, graded; print avg@N +- SE, 95% CI, pass@k, maj@N.

    Example: vapo-lab eval aime24 --samples 32 --model runs/vapo-seed0-20261122-080224 --step 100
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from vapo_lab.eval.harness import evaluate_model
    from vapo_lab.eval.responses import grade_responses
    from vapo_lab.eval.settings import MATH_TEMPLATE, EvalSettings
    from vapo_lab.progress import progress_bar

    settings = EvalSettings(samples=samples, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                            backend=backend, template=template or MATH_TEMPLATE, chunk_problems=chunk_problems,
                            device=device, threads=threads)
    name = bench or (str(data) if data else None)
    shown: set[str] = set()

    def log(message: str) -> None:
        shown.add(message)
        _err.print(message, highlight=False, soft_wrap=True, markup=False)

    if responses is not None:
        result = grade_responses(bench, responses, data=data, problem_key=problem_key, answer_key=answer_key,
                                 model=model, step=step, settings=settings, out_dir=out, runs_dir=runs_dir,
                                 track=not no_track, tracking_uri=tracking_uri)
    else:
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
                   TimeElapsedColumn(), TimeRemainingColumn()]
        with progress_bar(not quiet, _err, *columns) as bar:
            tasks: list[Any] = []  # added at the first report, after every check: a refusal prints alone

            def on_progress(done: int, total: int) -> None:
                if bar is not None:
                    if not tasks:
                        tasks.append(bar.add_task(f"eval {name}", total=total, completed=done, unit="sample"))
                    bar.update(tasks[0], completed=done, total=total)

            result = evaluate_model(bench, model=model, step=step, settings=settings, out_dir=out, data=data,
                                    problem_key=problem_key, answer_key=answer_key, runs_dir=runs_dir,
                                    track=not no_track, tracking_uri=tracking_uri, overwrite=overwrite,
                                    on_progress=on_progress, log=log)
    for warning in result.warnings:
        if f"warning: {warning}" not in shown:
            _err.print(f"warning: {warning}", highlight=False, soft_wrap=True, markup=False)
    _print_eval(result.summary, per_problem)


def _print_eval(s: dict[str, Any], per_problem: bool) -> None:
    """Prints an evaluation summary: settings, avg@N +- SE and CI, pass@k, maj@N, lengths, files."""
    m, g, b, mod = s["metrics"], s["generation"], s["benchmark"], s["model"]
    n = m["samples_per_problem"] if isinstance(m["samples_per_problem"], int) else m["samples_per_problem"]["min"]
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    where = (f"{mod['checkpoint']} (step {mod['step']})" if mod.get("checkpoint") else mod.get("path")) or "responses"
    if g["engine"] == "external":
        how = f"responses from {g['responses']}"
    else:
        how = (f"{g['engine']} ({g['engine_version']}), temperature {g['temperature']}, top_p {g['top_p']}, "
               f"max {g['max_tokens']} tokens, seed {g['seed']}")
    se = m[f"avg_at_{n}_se"]
    lo, hi = m[f"avg_at_{n}_ci95"]
    se_text = "n/a" if se is None else f"{100 * se:.1f}"
    length = "n/a" if m["response_length"] is None else f"{m['response_length']:.1f}"
    lines = [
        f"benchmark   {b['name']}: {m['problems_graded']} problems x {n} samples",
        f"model       {where}",
        f"sampling    {how}",
        (f"avg@{n:<7} {pct(m[f'avg_at_{n}'])} +- {se_text} (SE over problems), 95% bootstrap CI "
         f"[{100 * lo:.1f}, {100 * hi:.1f}]   mean per-sample accuracy = pass@1 from {n} samples"),
        "pass@k      " + "  ".join(f"k={k} {pct(v)}" for k, v in m["pass_at_k"].items()),
        f"maj@{n:<7} {pct(m[f'maj_at_{n}'])}",
        f"responses   mean length {length} tokens, truncated {pct(m['truncated_frac'])}",
    ]
    _out.print("\n".join(lines), highlight=False, soft_wrap=True, markup=False)
    if mod.get("name") == "tiny" and b["name"] != "arith":
        _out.print(f"note        the embedded tiny model (~1M parameters, taught only addition) cannot do "
                   f"{b['name']} problems: a score near zero is the expected, honest result", highlight=False,
                   soft_wrap=True, markup=False)
    if per_problem:
        cols = (_Col("problem", typed=True), _Col("reference", typed=True, justify="right"),
                _Col("correct", justify="right"), _Col("accuracy", justify="right"),
                _Col("majority answer", justify="right"))
        rows = [(row["problem_id"], row["reference"], f"{row['correct']}/{row['samples']}", pct(row["accuracy"]),
                 "-" if row["majority_answer"] is None
                 else f"{row['majority_answer'][:30]}{' (right)' if row['majority_correct'] else ''}")
                for row in s["per_problem"]]
        _print_table(None, cols, rows)
    t = s.get("tracking")
    track = "not logged" if not t else (f"{'new run' if t['new_run'] else 'training run'} {t['run_id']} at step "
                                        f"{t['step']} ({t['uri']})")
    _out.print(f"samples     {s['files']['samples']}\nsummary     {Path(s['files']['samples']).parent / 'summary.json'}\n"
               f"MLflow      {track}\ntime        {s['timing'].get('wall_s', s['timing'].get('grade_s', 0)):.1f} s",
               highlight=False, soft_wrap=True, markup=False)


@bench_app.command("generate")
@_cli_errors
def bench_generate(
    prompts: Annotated[int, typer.Option(help="Prompts in the batch (the arith eval split's first).")] = 8,
    samples: Annotated[int, typer.Option(help="Samples per prompt; rows = prompts x samples.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per row, exactly (eos disabled in both).")] = 128,
    repeats: Annotated[int, typer.Option(help="Timed runs per engine (median reported).")] = 3,
    threads: Annotated[int, typer.Option(help="torch CPU threads for both engines.")] = 1,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
) -> None:
    """Time the built-in sampler against Hugging Face generate on the same tiny model; print the ratio.

    Example: vapo-lab bench generate --prompts 8 --samples 8 --max-new-tokens 128
    """
    from vapo_lab.bench.generate import format_generate_benchmark, run_generate_benchmark

    result = run_generate_benchmark(prompts=prompts, samples=samples, max_new_tokens=max_new_tokens,
                                    repeats=repeats, threads=threads, seed=seed)
    typer.echo(format_generate_benchmark(result))


from vapo_lab.bench.trl_cli import bench_trl  # noqa: E402  (typer signature kept beside its benchmark)

bench_app.command("trl")(_cli_errors(bench_trl))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
