"""A small, fast configuration of the whole trainer, and a working directory for its caches."""

import json
import os

import pytest

from vapo_lab.runs.metrics_log import record_kind

VOLATILE = ("time/", "perf/")  # wall-clock metrics differ between identical runs

# a base model, reward model and critic small enough to build in seconds; 3-digit problems
SMALL = [
    "task.options.max_digits=3",
    "task.n_train=128",
    "task.n_eval=16",
    "model.arch.hidden_size=64",
    "model.arch.num_layers=2",
    "model.arch.intermediate_size=128",
    "+model.base.steps=200",
    "+model.base.eval_samples=1",
    "rollout.responses_per_step=16",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "rollout.eval_samples=2",
    "trainer.mini_batch_size=8",
    "trainer.max_tokens_per_micro_batch=4096",
    "trainer.total_steps=4",
    "trainer.eval_every=2",
    "trainer.save_every=1",
    "trainer.threads=2",
    "critic.pretrain.steps=2",
    "critic.rm_steps=2",
    "critic.rm_batch=16",
    "tracking=none",
    "reward.overlong.l_cache=4",
]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    """A working directory shared by the trainer tests, so the base model is built once."""
    path = tmp_path_factory.mktemp("train")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


def last_metrics(run_dir):
    """Returns {step: metrics} from a run's metrics.jsonl, the last record of each step, timings
    left out."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if record_kind(d) == "pretrain":  # value pretraining numbers its steps on its own
            continue
        rows[d["step"]] = {
            k: v for k, v in d.items() if not k.startswith(VOLATILE) and k != "timestamp_ms"
        }
    return rows
