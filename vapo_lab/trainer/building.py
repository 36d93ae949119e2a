"""A cache entry built in rounds that outlives its job: one builder a key, saved rounds, stops.

Building the reward model (``critic.rm_steps`` rounds) or pretraining the critic
(``critic.pretrain.steps``) can take hours at scale, longer than a Slurm job's time limit, and
every cell of a grid that shares a key needs the same entry. So:

- one build of a key at a time: rank 0 of the building job holds ``.locks/<kind>-<key>`` (a
  ``flock``, dropped by the kernel however its holder dies); another job that needs the key waits,
  polling so that its ranks' collectives stay short and a stop reaches it, then reuses the entry;
- a build saves its state (model, optimiser, the RNGs, the data position, its rounds' metrics) in
  ``.building/<kind>/<key>/step_<rounds done>`` every ``critic.save_every`` rounds (null: once
  ``SAVE_INTERVAL_S`` of rounds passed since the last save) and when it stops at a round's start for
  the job's time limit or Slurm's warning (``vapo_lab.stop``); whichever job builds the key next
  resumes there, to the same weights, tensor by tensor, as an uninterrupted build;
- a round's metrics are logged once, when its round is saved (or the entry written), never again
  by a resumed build.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vapo_lab.distributed.world import World
from vapo_lab.integrity import CACHE_DIR
from vapo_lab.runs.checkpoint import rng_state, set_rng_state
from vapo_lab.stop import AttemptClock, StopRequested, stop_point
from vapo_lab.trainer.checkpointer import CheckpointManager
from vapo_lab.trainer.collect import DataStream

# null critic.save_every: a build saves once this much of its rounds' time passed since its last
# save (a crash then loses at most this much; a save of a 7B critic takes ~1 min on a parallel
# filesystem)
SAVE_INTERVAL_S = 600.0
# how often a job waiting for another's build of the same key looks again
WAIT_POLL_S = 10.0

LogMetrics = Callable[[dict[str, float], int], None]


def lock_path(kind: str, key: str) -> Path:
    """The lock file of a build of ``<kind>/<key>`` (beside the entries: never mistaken for one)."""
    return CACHE_DIR / ".locks" / f"{kind}-{key}"


def partial_folder(kind: str, key: str) -> Path:
    """The folder a build of ``<kind>/<key>`` keeps its saved rounds in until the entry is
    written."""
    return CACHE_DIR / ".building" / kind / key


@contextlib.contextmanager
def one_builder(
    world: World, kind: str, key: str, what: str, log: Callable[[str], None]
) -> Iterator[None]:
    """Holds the build lock of ``<kind>/<key>`` on rank 0 for the body (every rank calls this): a
    job whose rank 0 finds it held waits, every rank polling with rank 0, until the holder is done
    (the caller then finds the entry it wrote, or builds it on from the holder's saved rounds)."""
    from vapo_lab.locks import Busy, exclusive

    with contextlib.ExitStack() as stack:
        waited = 0.0
        while True:
            held = False
            if world.main:
                try:
                    stack.enter_context(exclusive(lock_path(kind, key), what, "waiting for it"))
                    held = True
                except Busy as busy:
                    if not waited:
                        log(f"{busy} (its entry is reused once built)")
            if world.broadcast(held):
                break
            stop_point(world, can_save=False)  # a cancelled job stops while it waits
            time.sleep(WAIT_POLL_S)
            waited += WAIT_POLL_S
        if waited:
            log(f"waited {waited:.0f} s for another job's {what}")
        yield


class RoundBuild:
    """The saved rounds of one build and the loop over its rounds (every rank makes one).

    Args:
        kind, key: the cache entry being built.
        model, optimizer: what the rounds train.
        generators: the build's RNGs by name (each rank's own).
        data: the stream its rounds draw prompts from.
        save_every: rounds between saves; None: every ``SAVE_INTERVAL_S`` of rounds.
        clock: the attempt's measured times (a round, a save), for the time-limit stop.
        log_metrics: where a round's metrics go once it is saved; None: nowhere.
    """

    def __init__(
        self,
        kind: str,
        key: str,
        world: World,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        generators: dict[str, torch.Generator],
        data: DataStream,
        save_every: int | None,
        clock: AttemptClock,
        log: Callable[[str], None],
        log_metrics: LogMetrics | None = None,
    ) -> None:
        self.kind, self.key, self.world = kind, key, world
        self.generators, self.data, self.save_every = generators, data, save_every
        self.clock, self.log, self.log_metrics = clock, log, log_metrics
        self.history: list[Any] = []  # one entry per round done
        self.logged = 0  # rounds whose metrics went to log_metrics
        self.saved = 0  # rounds in the newest save
        self.since_save = 0.0  # seconds of rounds since then
        self.folder = partial_folder(kind, key)
        self.checkpoints = CheckpointManager(
            self.folder,
            world,
            {"model": model},
            {"optimizer": ("model", optimizer)},
            {},
            {"build": self},
            log,
        )

    def rounds(self, total: int) -> Iterator[int]:
        """Yields the rounds still to run, from where ``resume`` left off: before each, a stop
        point (the job's time limit, Slurm's warning, SIGTERM), saving first where the stop asks
        for it; after each, a save when one is due."""
        for r in range(len(self.history), total):
            try:
                need = self.clock.need(f"{self.kind} round", save=f"{self.kind} save")
                stop_point(self.world, can_save=r > self.saved, need_s=need)
            except StopRequested as stop:
                if stop.save:
                    self.save()
                if self.world.main:
                    what = self.kind.replace("_", " ")
                    self.log(
                        f"stopped the {what} build after round {self.saved} of {total} "
                        f"({stop.reason}): the same command resumes it there"
                    )
                raise
            t0 = time.perf_counter()
            yield r
            spent = time.perf_counter() - t0
            self.clock.add(f"{self.kind} round", spent)
            self.since_save += spent
            if self._due(r + 1) and r + 1 < total:
                self.save()

    def record(self, entry: Any) -> None:
        """Adds the round just run's ``entry`` (its metrics, or its loss) to the history."""
        self.history.append(entry)

    def resume(self) -> int:
        """Loads the newest save of this build, if any; returns the rounds it had done."""
        if not self.folder.is_dir():
            return 0
        t0 = time.perf_counter()
        if self.checkpoints.load() is not None:
            # until this attempt saves, reading the save stands in for writing one (same bytes)
            self.clock.add(f"{self.kind} save", time.perf_counter() - t0)
            self.saved = self.logged = len(self.history)
            if self.world.main:
                self.log(f"resumed the {self.kind.replace('_', ' ')} build at round {self.saved}")
        return len(self.history)

    def save(self) -> None:
        """Saves the rounds done so far (every rank), then logs their metrics not yet logged."""
        done = len(self.history)
        if done == self.saved:
            return
        with self.clock.timing(f"{self.kind} save"):
            self.checkpoints.save(done)
        self.saved, self.since_save = done, 0.0
        self.flush()

    def flush(self) -> None:
        """Logs the metrics of the rounds not logged yet (the entry is written, or they are
        saved)."""
        if self.log_metrics is not None:
            for i in range(self.logged, len(self.history)):
                self.log_metrics(self.history[i], i)
        self.logged = len(self.history)

    def finish(self) -> None:
        """The entry is written: logs what is left, then drops the saved rounds (rank 0)."""
        self.flush()
        if self.world.main:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.world.barrier()

    def _due(self, done: int) -> bool:
        if self.save_every is not None:
            return done % self.save_every == 0
        return self.since_save >= SAVE_INTERVAL_S

    # -- Stateful (per rank: each rank samples its own stream) ------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": self.history,
            "data": self.data.state(),
            "rng": rng_state(self.generators),
            "world_size": self.world.size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])
        self.data.load(state["data"])
        set_rng_state(state["rng"], self.generators)
