"""One training run on many ranks of this node: torchrun starts them, each runs :func:`main`.

``vapo-lab train trainer.strategy=fsdp trainer.nproc_per_node=N`` calls :func:`run_ranks`, which
runs this module under torchrun (:func:`torchrun_command`) and waits; torchrun stops every rank
when one fails. Each rank composes the same config from the same arguments; rank 0 alone opens
the run folder and tracking run and writes the result. A rank that fails writes its error line
where the parent finds it, so the run fails with that rank's message.

On many nodes, run the module under torchrun on each node yourself (docs/distributed.md has the
command), or submit the run to Slurm (``--launcher slurm``), whose tasks need no torchrun.

``python -m vapo_lab.launch.ranks --cell <file>`` is one rank of a grid cell instead: the file
holds the cell's ``CellJob`` as JSON (``CellJob.to_json``), and each rank runs ``run_cell`` on it
(the local launcher's many-rank cells: ``vapo_lab.launch.local``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from vapo_lab.errors import ConfigError, VapoLabError
from vapo_lab.launch.torchrun import LAUNCH_DIR, dead_rank, read_failures

RESULT_FILE = "result.json"
STARTED_FILE = "started.json"  # rank 0's run folder and tracking run, once they exist


class RankFailed(VapoLabError):
    """A rank of a many-rank run failed; the message is that rank's."""


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """Returns the torchrun command starting ``nproc`` ranks of ``vapo-lab train <args>`` here."""
    return [
        sys.executable,
        "-m",
        "vapo_lab.launch.torchrun",  # torchrun, its failures as data (vapo_lab.launch.torchrun)
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "vapo_lab.launch.ranks",
        *args,
    ]


def run_ranks(cfg: Any, args: list[str], command: str, quiet: bool) -> dict[str, Any]:
    """Runs the ranks of ``cfg`` on this node with torchrun; returns rank 0's result summary.

    Raises:
        ConfigError: trainer.nodes > 1 (torchrun here starts this node's ranks only).
        RankFailed: a rank failed (its message), or torchrun did (its exit status).
    """
    nodes = int(cfg.trainer.nodes)
    if nodes > 1:
        raise ConfigError(
            f"trainer.nodes={nodes}: `vapo-lab train` starts the ranks of this node only. "
            "Submit the run to Slurm (`vapo-lab sweep ... --launcher slurm`), "
            f"or run on each node `torchrun --nnodes {nodes} "
            f"--nproc-per-node {cfg.trainer.nproc_per_node} --rdzv-backend c10d --rdzv-endpoint "
            "<first node>:29500 -m vapo_lab.launch.ranks <the same arguments>`"
        )
    with tempfile.TemporaryDirectory(prefix="vapo-ranks-") as folder:
        env = {
            # torchrun's own default, set here so that it does not print a banner about it
            "OMP_NUM_THREADS": "1",
            **os.environ,
            LAUNCH_DIR: folder,
            "VAPO_COMMAND": command,
            "VAPO_QUIET": "1" if quiet else "",
        }
        done = subprocess.run(torchrun_command(int(cfg.trainer.nproc_per_node), args), env=env)
        result = Path(folder) / RESULT_FILE
        if done.returncode == 0 and result.is_file():
            return json.loads(result.read_text())
        raise RankFailed(failure_line(Path(folder), done.returncode))


def failure_line(folder: Path, returncode: int) -> str:
    """Returns the one line a failed many-rank run ends with: the rank that died of a signal (the
    run marked FAILED, ``mark_failed``), else the error line of the rank that failed first (its
    traceback kept beside the run's failure.txt), else torchrun's exit status."""
    errors = sorted(folder.glob("rank*.error"), key=lambda p: p.stat().st_mtime)
    reported = {int(p.stem.removeprefix("rank")) for p in errors}
    dead = dead_rank(read_failures(folder), reported)
    started = _started(folder)
    if dead is not None:
        return mark_failed(started, dead)
    if not errors:
        return f"torchrun exited with status {returncode}"
    text = errors[0].read_text()
    if started and errors[0].stem != "rank0":  # rank 0's own traceback is in failure.txt
        with contextlib.suppress(OSError):
            (Path(started["run_dir"]) / f"failure.{errors[0].stem}.txt").write_text(text)
    return text.splitlines()[0]


def _started(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / STARTED_FILE).read_text())
    except (OSError, ValueError):
        return None  # rank 0 died before its run existed


def mark_failed(started: dict[str, Any] | None, dead: dict[str, Any]) -> str:
    """Records that rank ``dead["rank"]`` died of ``dead["signal"]``: failure.txt in the run folder
    (rank 0's own note, if it wrote one, kept below) and the tracking run FAILED, with every step
    of metrics.jsonl the store lacks (rank 0's sender may have died with them); a store that does
    not answer gets it later (``vapo_lab.trainer.heal``). Returns the line that says so.

    ``started``: rank 0's run folder and tracking run (None: it died before they existed)."""
    from vapo_lab.runs.folder import METRICS_FILE
    from vapo_lab.runs.metrics_log import MetricsLog, record_kind

    why = f"rank {dead['rank']} died: killed by {dead['signal']}"
    if dead["signal"] == "SIGKILL":
        why += " (the out-of-memory killer, or kill -9)"
    if started is None:
        return f"{why} before the run started; nothing was recorded: run the same command again"
    run_dir = Path(started["run_dir"])
    records = MetricsLog(run_dir / METRICS_FILE, warn=lambda text: None).records()
    steps = [r["step"] for r in records if record_kind(r["metrics"]) == "train"]
    step = max(steps, default=0)
    resume = f"vapo-lab train resume={run_dir}"
    failure = run_dir / "failure.txt"
    with contextlib.suppress(OSError):  # the line returned below still says it
        before = failure.read_text() if failure.is_file() else ""
        failure.write_text(
            f"failed after step {step} on {time.strftime('%Y-%m-%d %H:%M:%S')}: {why}\n"
            f"continue it with: {resume}\n"
            + (f"\nrank 0 then stopped with:\n{before}" if before else "")
        )
    uri = started.get("uri", "none")
    if uri != "none":
        from vapo_lab.track import MlflowTracker
        from vapo_lab.track.mlflow_tracker import spool_folder
        from vapo_lab.track.store import TrackingError
        from vapo_lab.trainer.heal import note_pending

        spool = spool_folder(started.get("spool_dir"))
        try:
            settled = MlflowTracker(uri, spool_dir=spool).settle(
                started["run_id"], "FAILED", records
            )
        except TrackingError:
            settled = False
        if not settled:
            note_pending(spool, uri, started["run_id"], "FAILED", run_dir)
    return (
        f"{why} after step {step}; the other ranks stopped after it. The run is marked FAILED; "
        f"continue it with: {resume}"
    )


def _split_args(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    algo, drop, overrides = None, [], []
    for a in argv:
        if a.startswith("--algo="):
            algo = a.split("=", 1)[1]
        elif a.startswith("--drop="):
            drop.append(a.split("=", 1)[1])
        else:
            overrides.append(a)
    return algo, drop, overrides


def main(argv: list[str] | None = None) -> int:
    """One rank: composes the config from ``argv`` ([--algo=X] [--drop=C ...] overrides) and
    trains; with ``argv`` = ``--cell <file>``, runs the grid cell in that file."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--cell"]:
        return cell_main(argv[1:])
    from vapo_lab.config.train import train_config
    from vapo_lab.stop import sigterm_interrupts
    from vapo_lab.trainer.trainer import running

    rank = int(os.environ.get("RANK", "0"))
    folder = Path(os.environ[LAUNCH_DIR]) if os.environ.get(LAUNCH_DIR) else None
    quiet = bool(os.environ.get("VAPO_QUIET"))

    def log(text: str) -> None:
        if rank == 0:
            print(text, file=sys.stderr, flush=True)

    try:
        sigterm_interrupts()
        cfg, choices = train_config(*_split_args(argv))
        command = os.environ.get("VAPO_COMMAND", "")
        with running(cfg, choices, log=log, command=command) as trainer:
            uri = getattr(trainer.tracker, "uri", "none")
            if rank == 0 and folder is not None:  # for the launcher, should this rank die
                spool = getattr(trainer.tracker, "spool_dir", None)
                started = {"run_dir": str(trainer.run_dir), "run_id": trainer.run_id, "uri": uri}
                (folder / STARTED_FILE).write_text(
                    json.dumps({**started, "spool_dir": spool and str(spool.resolve())})
                )
            log(
                f"run {trainer.run_dir} (tracking run {trainer.run_id}, {uri}) on "
                f"{trainer.world.size} ranks"
            )
            total = int(cfg.trainer.total_steps)

            def on_step(step: int, m: dict[str, float]) -> None:
                if not quiet:
                    log(
                        f"step {step}/{total}  reward {m.get('rollout/reward', float('nan')):.3f}  "
                        f"acc {m.get('rollout/accuracy', float('nan')):.3f}  "
                        f"len {m.get('rollout/response_length', float('nan')):.0f}  "
                        f"{m.get('time/step_s', 0):.1f}s"
                    )

            result = trainer.train(on_step)
        if rank == 0 and folder is not None:
            import resource

            summary = {
                **result.summary(),
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
            (folder / RESULT_FILE).write_text(json.dumps(summary))
        return 0
    except BaseException as e:
        if folder is not None:
            last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
            (folder / f"rank{rank}.error").write_text(
                f"rank {rank}: {type(e).__name__}: {last}\n\n" + traceback.format_exc()
            )
        # a stop: rank 0 said where and how to resume, no traceback
        if isinstance(e, KeyboardInterrupt):
            return 130
        if folder is not None:  # the launcher says it in one line (failure_line)
            return 1
        raise


def cell_main(argv: list[str]) -> int:
    """One rank of a grid cell: ``run_cell`` of the ``CellJob`` in the JSON file ``argv[0]``. Its
    status file says how it went (rank 0 writes it; a failing rank leaves its error line there)."""
    from vapo_lab.launch.cell import CellJob, run_cell

    if len(argv) != 1:
        raise SystemExit("usage: python -m vapo_lab.launch.ranks --cell <cell job JSON file>")
    run_cell(CellJob.from_json(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
