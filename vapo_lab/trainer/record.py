"""A training run's record: its folder and its tracking run.

The folder ``<output_dir>/<run name>/`` holds ``run.json`` (the tracking run's id, the command and
the component choices), ``config.yaml`` (resolved), ``metrics.jsonl`` (every logged metric, the
local record that never depends on a server) and, for a run that did not finish, ``failure.txt``
(why, and how to continue it). ``resume=<run dir>`` reopens the same folder and tracking run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from vapo_lab.errors import ConfigError
from vapo_lab.registry.components import COMPONENTS
from vapo_lab.runs.folder import CONFIG_FILE, METRICS_FILE, RUN_FILE, is_run_dir, run_name_taken
from vapo_lab.runs.metrics_log import MetricsLog
from vapo_lab.track import flatten, make_tracker
from vapo_lab.track.mlflow_tracker import first_line
from vapo_lab.trainer.heal import NOTE, note_pending

if TYPE_CHECKING:
    from vapo_lab.config.schema import VapoConfig


PACKAGE = Path(__file__).resolve().parents[1]
# written by `git archive` (export-subst, .gitattributes); a checkout holds $Format:%H$ unexpanded
COMMIT_FILE = PACKAGE / "COMMIT"


def git_commit() -> str:
    """Returns the commit of vapo-lab's code: HEAD of the checkout it runs from, else the commit
    a `git archive` copy (a pinned grid's) wrote into ``COMMIT_FILE``, else 'unknown'. A checkout
    counts only when it is vapo-lab's own, not a repository an installed copy happens to sit in."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=PACKAGE,
        )
        top, head = (out.stdout.splitlines() + ["", ""])[:2]
        if out.returncode == 0 and Path(top).resolve() == PACKAGE.parent:
            return head
    except (OSError, subprocess.SubprocessError):
        pass
    written = COMMIT_FILE.read_text().strip() if COMMIT_FILE.is_file() else ""
    return written if written and not written.startswith("$Format") else "unknown"


def machine() -> str:
    """Returns what a CPU run's metrics depend on beyond its seed and config: the CPU model, the
    instruction set torch's kernels dispatch to (AVX2 and AVX-512 round differently, so the same
    seed diverges in its last bits), and torch's and Python's versions."""
    import torch  # lazily: the trainer has it loaded already; the report reads tags without it

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    isa = torch.backends.cpu.get_cpu_capability()
    return f"{model} ({isa}), torch {torch.__version__}, python {platform.python_version()}"


def component_tags(choices: dict[str, str]) -> dict[str, str]:
    """Returns MLflow tags for the components: each one's state and the dropped list."""
    off = [c.name for c in COMPONENTS if choices.get(c.name) == "off"]
    return {
        **{f"component.{c.name}": choices.get(c.name, "?") for c in COMPONENTS},
        "components_off": ",".join(off) or "none",
    }


def folder_to_resume(resume: str | None) -> Path | None:
    """Returns the run folder that ``resume=`` names (None: a new run).

    Raises:
        ConfigError: the folder is not a run's (no run.json).
    """
    resume_dir = Path(resume) if resume else None
    if resume_dir is not None and not is_run_dir(resume_dir):
        raise ConfigError(
            f"resume={resume} is not a vapo-lab run directory (no {RUN_FILE}): "
            "give the folder a run printed at its start, e.g. runs/vapo-seed0-..."
        )
    return resume_dir


def claim_run_dir(cfg: VapoConfig) -> Path:
    """Creates and returns a new run's folder. ``mkdir`` without ``exist_ok`` claims a name
    atomically: two runs started together never share a folder.

    A ``run_name`` is claimed exactly (a grid cell's is its key): taken, the run is refused, never
    moved to another name. Without one the name is ``<algo>-seed<seed>-<time>``, numbered (-2, -3,
    ...) when two runs start in the same second.

    Raises:
        ConfigError: ``run_name``'s folder exists (``check_run`` says so before any compute; this is
            the race it cannot see).
    """
    root = Path(cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    if cfg.run_name:
        path = root / cfg.run_name
        try:
            path.mkdir()
        except FileExistsError:
            raise ConfigError(run_name_taken(cfg.run_name, path)) from None
        return path
    name = f"{cfg.algo.name}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = root / name, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            i += 1
            path = root / f"{name}-{i}"


class RunRecord:
    """The folder and tracking run of one training run.

    Creating it opens the tracking store, claims the folder and starts (or, resuming, reopens) the
    tracking run; ``open()`` then writes the run's files. Between the two a failure is recorded with
    ``close``.
    """

    def __init__(
        self,
        cfg: VapoConfig,
        choices: dict[str, str],
        resume_dir: Path | None,
        command: str,
        tags: dict[str, str] | None,
        parent_run_id: str | None,
        log: Callable[[str], None],
    ) -> None:
        self.cfg, self.choices, self.resume_dir, self.log = cfg, choices, resume_dir, log
        self.command = command or " ".join(sys.argv)
        # the store first: a run that cannot open it has claimed no folder to leave behind
        self.tracker = make_tracker(
            cfg.tracking.backend,
            cfg.tracking.uri,
            cfg.tracking.experiment,
            cfg.tracking.spool_dir,
            log=log,
        )
        self.run_dir = resume_dir or claim_run_dir(cfg)
        try:
            self.run_id = self._start(tags, parent_run_id)
        except BaseException:
            # claimed above, nothing of this run anywhere: leave no empty folder
            if resume_dir is None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _start(self, tags: dict[str, str] | None, parent_run_id: str | None) -> str:
        """Returns the id of the tracking run started (or, resuming, reopened) for the folder."""
        cfg = self.cfg
        previous = json.loads((self.run_dir / RUN_FILE).read_text()) if self.resume_dir else {}
        tags = {
            "algo": cfg.algo.name,
            "seed": str(cfg.seed),
            "experiment": cfg.tracking.experiment,
            "scale": cfg.scale.name,
            "git_commit": git_commit(),
            "machine": machine(),
            "run_dir": str(self.run_dir),
            **component_tags(self.choices),
            **(tags or {}),
        }
        params = dict(flatten(dataclasses.asdict(cfg)))
        params["command"] = self.command
        if previous.get("run_id") and hasattr(self.tracker, "spool_dir"):
            # this run goes on: it sends its own spool and sets its own status
            (self.tracker.spool_dir / f"{previous['run_id']}{NOTE}").unlink(missing_ok=True)
        run_id = self.tracker.start(
            self.run_dir.name,
            tags,
            params,
            resume_run_id=previous.get("run_id"),
            parent_run_id=parent_run_id,
        )
        if previous.get("run_id"):  # a resumed run keeps the tags it started with
            self.tracker.set_tags({"machine.resumed": tags["machine"]})
        return run_id

    def open(self) -> None:
        """Writes run.json and config.yaml (a new run) and opens metrics.jsonl; resuming, sends the
        tracker the steps a killed process wrote locally but never got to send."""
        if not self.resume_dir:
            (self.run_dir / RUN_FILE).write_text(
                json.dumps(
                    {
                        "run_id": self.run_id,
                        "tracking_uri": getattr(self.tracker, "uri", "none"),
                        "command": self.command,
                        "choices": self.choices,
                    },
                    indent=2,
                )
            )
            text = OmegaConf.to_yaml(OmegaConf.structured(self.cfg))
            (self.run_dir / CONFIG_FILE).write_text(text)
            self.tracker.log_text(text, CONFIG_FILE)
        self.metrics_log = MetricsLog(self.run_dir / METRICS_FILE, warn=self.log)
        if self.resume_dir:
            self.tracker.backfill(self.metrics_log.records())

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Records ``metrics`` at ``step`` in metrics.jsonl, then the tracker; a step already
        recorded before an interruption is not recorded again (see ``MetricsLog``)."""
        now = int(time.time() * 1000)
        if self.metrics_log.add(step, metrics, now):
            self.tracker.log_metrics(metrics, step, now)

    def close(self, status: str, step: int, error: BaseException | None = None) -> None:
        """Ends the tracking run as ``status`` (FINISHED, FAILED, KILLED); a run that did not finish
        says why in ``failure.txt`` in its folder (``resume=<run dir>`` continues it). Raises
        nothing of its own: a file that cannot be written (a full disk) is told in a line, and the
        tracking run is ended whatever happened to the files."""
        try:
            self._note_failure(status, step, error)
        finally:
            self._end_tracking(status)

    def close_on_error(self, error: BaseException, step: int) -> None:
        """Ends the tracking run as KILLED (an interrupt) or FAILED, saying why in failure.txt."""
        self.close("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED", step, error)

    def _note_failure(self, status: str, step: int, error: BaseException | None) -> None:
        """Writes failure.txt for a run that did not finish, removes an old one for a run that did;
        an OSError (a full disk) is told in one line, never raised over the run's own error."""
        failure = self.run_dir / "failure.txt"
        if error is None:
            try:
                failure.unlink(missing_ok=True)
            except OSError as e:
                self.log(
                    f"could not remove {failure} of an earlier failure ({e.strerror or e}): the "
                    "run finished"
                )
            return
        what = "interrupted" if status == "KILLED" else "failed"
        resume = f"continue it with: vapo-lab train resume={self.run_dir}"
        try:
            failure.write_text(
                f"{what} at step {step} on {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{type(error).__name__}: {error}\n{resume}\n\n"
                + "".join(traceback.format_exception(error)),
                encoding="utf-8",
                errors="backslashreplace",
            )
        except OSError as e:
            self.log(
                f"could not write {failure} ({e.strerror or e}): the run {what} at step {step}; "
                f"{resume}"
            )
            with contextlib.suppress(OSError):  # a half-written failure.txt would mislead
                failure.unlink()

    def _end_tracking(self, status: str) -> None:
        """Marks the tracking run ``status``; a tracker that fails is told in one line, never
        raised."""
        try:
            spool = self.tracker.finish(status)
        except Exception as e:  # noqa: BLE001 - never an error on top of the run's own
            self.log(
                f"tracking: could not mark run {self.run_id} {status} ({first_line(e)}); its "
                "metrics are in "
                f"{self.run_dir / METRICS_FILE}"
            )
            return
        if spool is None and self.tracker.status_sent:
            return
        try:  # the store did not hear all of it: a note for the next jobs / report / resubmission
            t = self.tracker
            note_pending(t.spool_dir, t.uri, self.run_id, status, self.run_dir)
        except OSError as e:
            self.log(f"tracking: could not note run {self.run_id} as pending ({e.strerror or e})")
        self.log(
            f"tracking: MLflow at {self.tracker.uri} did not take all of run {self.run_id} "
            f"({'metrics kept in ' + str(spool) if spool else 'its final status'}): sent once it "
            "answers, by the next `vapo-lab jobs`, `report`, grid resubmission or `train resume=`"
        )


class RankRecord:
    """The record of a rank other than 0 of a many-rank run: rank 0's folder and tracking run id,
    and nothing written (rank 0 alone logs, tracks and writes the run's files)."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        from vapo_lab.track import NullTracker

        self.run_dir, self.run_id, self.tracker = run_dir, run_id, NullTracker()

    def open(self) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self, status: str, step: int, error: BaseException | None = None) -> None:
        pass

    def close_on_error(self, error: BaseException, step: int) -> None:
        pass
