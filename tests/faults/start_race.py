"""One of several processes that start runs at the same instant: in each round it waits until every
process is ready, then opens a RunRecord (claims a run folder, opens the tracking store, starts the
run) in that round's fresh folder and prints one JSON line saying what it got.

Usage: python start_race.py ROOT INDEX PROCESSES ROUNDS BACKEND [NAME] (BACKEND: mlflow | none;
NAME: every process's run_name, none without)."""

import dataclasses
import json
import sys
import time
from pathlib import Path

from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.trainer.record import RunRecord

BASE = typed(compose_config().cfg)


def config(folder: Path, backend: str, name: str | None):
    """A run's typed config; every process of a round names its run ``name`` (None: the automatic
    name, the same within a second). Composed once a process, so that the racers start within
    milliseconds of each other."""
    tracking = dataclasses.replace(
        BASE.tracking,
        backend=backend,
        uri=f"sqlite:///{folder / 'mlflow.db'}",
        experiment="race",
        spool_dir=str(folder / "spool"),
    )
    return dataclasses.replace(
        BASE, run_name=name, output_dir=str(folder / "runs"), tracking=tracking
    )


def wait_for_all(folder: Path, index: int, processes: int, timeout: float = 300.0) -> None:
    """A barrier on files: returns once every process of the round has arrived, all within a few
    ms."""
    ready = folder / "ready"
    ready.mkdir(parents=True, exist_ok=True)
    (ready / str(index)).touch()
    deadline = time.monotonic() + timeout
    while len(list(ready.iterdir())) < processes:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(list(ready.iterdir()))} of {processes} processes arrived"
            )
        time.sleep(0.0005)


def start(folder: Path, backend: str, name: str | None) -> dict:
    """Opens and closes one run; returns its folder and id, or the error it ended with."""
    try:
        record = RunRecord(
            config(folder, backend, name), {}, None, "race", None, None, log=lambda text: None
        )
        record.open()
        record.close("FINISHED", 0)
        return {"run_dir": str(record.run_dir), "run_id": record.run_id}
    except Exception as e:  # noqa: BLE001 - the test reports what each process met
        import traceback

        first = str(e).splitlines()[0][:300] if str(e) else ""
        return {
            "error": f"{type(e).__name__}: {first}",
            "traceback_lines": len(traceback.format_exc().splitlines()),
        }


def main(
    root: str, index: str, processes: str, rounds: str, backend: str, name: str = "none"
) -> None:
    for k in range(int(rounds)):
        folder = Path(root) / str(k)
        wait_for_all(folder, int(index), int(processes))
        print(
            json.dumps(
                {
                    "round": k,
                    "index": int(index),
                    **start(folder, backend, None if name == "none" else name),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
