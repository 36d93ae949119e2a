"""An MLflow tracking server with the flags a grid needs (``vapo-lab server``, and the tests').

A server lets jobs on many machines (Slurm, Ray) log to one place over HTTP. Bound to 127.0.0.1
unless told otherwise: MLflow's server has no authentication. The backend store is a SQLite file
and the artifacts a folder, both under ``store``; artifacts are proxied through the server
(``--artifacts-destination``), so jobs need no access to the folder. MLflow's job runner (a set
of extra worker processes, ~250 MB each, unused here) is switched off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from vapo_lab.errors import VapoLabError


class ServerError(VapoLabError):
    """The tracking server did not start."""


def server_command(host: str, port: int, store: str | Path) -> list[str]:
    store = Path(store).resolve()
    mlflow = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    return [
        mlflow,
        "server",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{store / 'mlflow.db'}",
        "--artifacts-destination",
        str(store / "artifacts"),
    ]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class MlflowServer:
    """A running ``mlflow server`` child process; ``stop()`` (or the context manager) ends it."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5000,
        store: str | Path = "mlflow-server",
        timeout_s: float = 120.0,
    ) -> None:
        self.url = f"http://{host}:{port}"
        if _healthy(self.url):
            raise ServerError(
                f"something already answers at {self.url}: use it (tracking.uri={self.url}) "
                "or choose another --port"
            )
        Path(store).mkdir(parents=True, exist_ok=True)
        self.log_path = Path(store).resolve() / "server.log"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                server_command(host, port, store),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not _healthy(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or [
                    "(no output)"
                ]
                self.stop()
                raise ServerError(
                    f"mlflow server on {host}:{port} did not start: {tail[0][:200]} "
                    f"(log {self.log_path})"
                )
            time.sleep(0.3)

    def stop(self) -> None:
        """Stops the server and its worker processes (one process group)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> MlflowServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ui_hint(url: str) -> str:
    """Returns how to see an experiment's runs table and metric charts in the UI at ``url``.

    MLflow 3.17's UI takes its view from the switch at the top of its sidebar (the browser keeps
    it) or from the URL's ``workflowType``, and is GenAI (traces) by default: the experiment's kind
    tag that vapo-lab sets is not enough there.
    """
    return (
        "runs tables and metric charts: "
        "choose 'Model training' at the top of the UI's sidebar, or open "
        f"{url}/#/experiments/<id>?workflowType=machine_learning"
    )


def serve_forever(
    host: str, port: int, store: str | Path, log: Callable[[str], None] = print
) -> None:
    """Runs a server until Ctrl-C or SIGTERM (either stops the server's whole process group)."""

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    server = MlflowServer(host, port, store)
    log(
        f"MLflow server at {server.url} (store {Path(store).resolve()}, log {server.log_path}); "
        f"runs log there with tracking.uri={server.url}. Ctrl-C stops it."
    )
    log(ui_hint(server.url))
    try:
        while server.proc.poll() is None:
            time.sleep(1.0)
        raise ServerError(
            f"mlflow server exited with code {server.proc.returncode} (log {server.log_path})"
        )
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
