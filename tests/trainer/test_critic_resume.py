"""The critic's start survives its job: the reward-model build and value pretraining stop at a
round's start (Slurm's warning, the job's time limit), save, and the same call resumes them to the
same weights, tensor by tensor, as an uninterrupted build, each round's metrics logged once."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from vapo_lab import stop
from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.integrity import CACHE_DIR
from vapo_lab.stop import StopRequested, stop_on_signals
from vapo_lab.trainer import building
from vapo_lab.trainer.caches import start_critic
from vapo_lab.trainer.setup import build_parts

from .conftest import SMALL

pytestmark = pytest.mark.slow

ROUNDS = [*SMALL, "critic.rm_steps=5", "critic.pretrain.steps=5", "critic.save_every=2"]


def _start(workdir, overrides, log=None):
    """Runs the critic's start in ``workdir``; returns [(step, metrics)] it logged."""
    os.chdir(workdir)
    config = typed(compose_config(overrides=overrides).cfg)
    parts = build_parts(config, lambda text: None)
    logged = []
    start_critic(config, parts, lambda m, s: logged.append((s, m)), log or (lambda text: None))
    return logged


def _tensors(kind):
    (entry,) = list((CACHE_DIR / kind).iterdir())
    files = sorted(entry.rglob("*.safetensors"))
    assert files
    out = {}
    for f in files:
        out.update({f"{f.relative_to(entry)}:{k}": v for k, v in load_file(f).items()})
    return out, json.loads((entry / "meta.json").read_text())


def _assert_same_entries(run, reference):
    os.chdir(reference)
    expected = {k: _tensors(k) for k in ("reward_model", "pretrained_critic")}
    os.chdir(run)
    for kind, (tensors, meta) in expected.items():
        got, got_meta = _tensors(kind)
        assert got.keys() == tensors.keys()
        for name, t in tensors.items():
            assert got[name].equal(t), f"{kind} {name} differs"
        assert got_meta == meta
        # the build's saved rounds are cleaned up; the entry's folder holds entries only
        assert not (CACHE_DIR / ".building" / kind).exists() or not any(
            (CACHE_DIR / ".building" / kind).iterdir()
        )
        assert all(not p.name.startswith(".") for p in (CACHE_DIR / kind).iterdir())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted build: its folder and what it logged."""
    old = os.getcwd()
    ref = Path(tmp_path_factory.mktemp("reference"))
    logged = _start(ref, ROUNDS)
    os.chdir(old)
    return ref, logged


@pytest.fixture
def dirs(reference, tmp_path):
    """(the reference's folder, a fresh folder holding its base model only)."""
    old = os.getcwd()
    ref = reference[0]
    for entry in (ref / CACHE_DIR).iterdir():
        if entry.name not in ("reward_model", "pretrained_critic"):
            shutil.copytree(entry, tmp_path / CACHE_DIR / entry.name)
    yield ref, tmp_path
    os.chdir(old)


def _warn_at(monkeypatch, kind, rounds_done):
    """Sends Slurm's warning (SIGUSR2) once ``kind``'s build has recorded ``rounds_done`` rounds."""
    real = building.RoundBuild.record
    sent = []

    def record(self, entry):
        real(self, entry)
        if self.kind == kind and len(self.history) == rounds_done and not sent:
            sent.append(rounds_done)
            os.kill(os.getpid(), signal.SIGUSR2)

    monkeypatch.setattr(building.RoundBuild, "record", record)


def test_a_stopped_critic_start_resumes_to_the_uninterrupted_weights_and_metrics_once(
    dirs, reference, monkeypatch
):
    ref, run = dirs
    reference = reference[1]
    assert [s for s, _ in reference] == [0, 1, 2, 3, 4]

    previous = signal.getsignal(signal.SIGUSR2)
    lines = []
    try:
        with stop_on_signals():
            # the reward model: warned in its 3rd round, it saves 3 rounds at the 4th's start
            # (save_every 2 alone would have saved 2)
            stop.sigterm_interrupts(save_within=60)
            _warn_at(monkeypatch, "reward_model", 3)
            with pytest.raises(StopRequested) as e:
                _start(run, ROUNDS, lines.append)
            assert e.value.save
            saved = sorted(p.name for p in (CACHE_DIR / ".building/reward_model").glob("*/step_*"))
            assert saved == ["step_000002", "step_000003"]
            # the same call resumes it; pretraining is warned in its 3rd round, after a save of 2
            monkeypatch.undo()
            stop.sigterm_interrupts(save_within=60)
            _warn_at(monkeypatch, "pretrained_critic", 3)
            with pytest.raises(StopRequested):
                _start(run, ROUNDS, lines.append)
            monkeypatch.undo()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert "resumed the reward model build at round 3" in lines
    (partial,) = (CACHE_DIR / ".building" / "pretrained_critic").iterdir()
    assert (partial / "step_000003").is_dir()

    last = _start(run, ROUNDS, lines.append)
    assert "resumed the pretrained critic build at round 3" in lines
    # rounds 0-2 were logged by the stopped attempt as they were saved, 3 and 4 by the last
    assert [s for s, _ in last] == [3, 4]
    assert last == reference[3:]
    _assert_same_entries(run, ref)


def test_the_time_limit_stops_a_build_at_a_round_it_cannot_finish_and_save(dirs, monkeypatch):
    ref, run = dirs
    unsaved = [o for o in ROUNDS if not o.startswith("critic.save_every")]  # no periodic save
    with stop_on_signals() as handler:
        # a deadline that leaves room for the first rounds only: each round is measured, and the
        # build stops at the first whose round + save + margin no longer fits
        real = building.RoundBuild.rounds

        def rounds(self, total):
            for r in real(self, total):
                if r == 1 and handler.deadline is None:
                    handler.deadline = time.time() + stop.STOP_MARGIN_S + 0.01
                yield r

        monkeypatch.setattr(building.RoundBuild, "rounds", rounds)
        with pytest.raises(StopRequested) as e:
            _start(run, unsaved)
        assert e.value.reason == "time limit" and e.value.save
    monkeypatch.undo()
    (partial,) = (CACHE_DIR / ".building" / "reward_model").iterdir()
    assert (partial / "step_000002").is_dir()  # rounds 0 and 1 done, the third never started
    _start(run, ROUNDS)
    _assert_same_entries(run, ref)


def test_a_build_resumes_from_its_periodic_save_after_a_hard_kill(dirs, monkeypatch):
    ref, run = dirs
    # a kill in round 3 of pretraining (no stop point reached): rounds 0-1 were saved by
    # save_every 2, so the next start redoes 2 and 3 from there
    real = building.RoundBuild.record

    def record(self, entry):
        real(self, entry)
        if self.kind == "pretrained_critic" and len(self.history) == 3:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(building.RoundBuild, "record", record)
    with pytest.raises(KeyboardInterrupt):
        logged = _start(run, ROUNDS)
    monkeypatch.undo()
    real_resume, read = building.RoundBuild.resume, {}

    def resume(self):
        done = real_resume(self)
        read[self.kind] = self.clock.last.get(f"{self.kind} save")
        return done

    monkeypatch.setattr(building.RoundBuild, "resume", resume)
    logged = _start(run, ROUNDS)
    assert [s for s, _ in logged] == [2, 3, 4]  # 0 and 1 went out with their save
    # reading the save stood in for a save's time until this attempt's first save
    assert list(read) == ["pretrained_critic"] and read["pretrained_critic"] > 0
    _assert_same_entries(run, ref)


BUILD = """
import hashlib, sys, torch
from tests.trainer.test_critic_resume import ROUNDS, _start
from vapo_lab.trainer import caches
critic = []
real = caches.CriticStart.critic
caches.CriticStart.critic = lambda self: critic.append(real(self)) or critic[-1]
_start(".", ROUNDS, lambda text: print(text, flush=True))
h = hashlib.sha256()
for name, t in sorted(critic[0].state_dict().items()):
    h.update(name.encode()); h.update(t.detach().float().numpy().tobytes())
print("critic", h.hexdigest(), flush=True)
"""


def test_two_jobs_that_need_the_same_critic_build_it_once_and_both_use_it(dirs):
    import subprocess
    import sys

    ref, run = dirs
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD], cwd=run, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [j.communicate(timeout=600)[0] for j in jobs]
    assert [j.returncode for j in jobs] == [0, 0], outs
    text = "".join(outs)
    assert text.count("building the reward model") == 1, text
    assert text.count("pretraining the critic") == 1, text
    assert "waiting for it (its entry is reused once built)" in text
    hashes = {ln.split()[1] for ln in text.splitlines() if ln.startswith("critic ")}
    assert len(hashes) == 1  # both start from the one build
    _assert_same_entries(run, ref)
    assert len(list((run / CACHE_DIR / "pretrained_critic").iterdir())) == 1  # one entry
