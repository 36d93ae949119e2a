"""Our side of the benchmark: the trainer's config and its worker process."""

import sys

import pytest

from vapo_lab.bench.trl.ours import bench_config
from vapo_lab.bench.trl.protocol import WorkerProcess, worker_argv, worker_env
from vapo_lab.bench.trl.spec import BenchSpec


@pytest.mark.parametrize(
    "algo, n_samples, kl", [("ppo", 1, 0.05), ("vapo", 8, 0.0), ("grpo", 8, 0.04)]
)
def test_our_config_does_the_benchmark_work(tmp_path, algo, n_samples, kl):
    cfg = bench_config(algo, tmp_path, BenchSpec(), tmp_path).cfg
    assert cfg.algo.name == algo
    assert (cfg.rollout.responses_per_step, cfg.rollout.max_new_tokens, cfg.rollout.n_samples) == (
        64,
        32,
        n_samples,
    )
    assert (cfg.trainer.ppo_epochs, cfg.trainer.mini_batch_size, cfg.trainer.threads) == (1, 16, 2)
    assert cfg.model.dtype == "float32" and cfg.kl.coef == kl and cfg.tracking.backend == "none"
    assert not cfg.critic.pretrain.enabled


def test_our_worker_runs_steps_over_the_pipe(model_dir, tmp_path, small_spec):
    argv = worker_argv(sys.executable, "ours-ppo", model_dir, small_spec, tmp_path)
    worker = WorkerProcess("ours-ppo", argv, tmp_path / "worker.log", worker_env(small_spec))
    try:
        ready = worker.recv(timeout=300)
        assert (
            ready["event"] == "ready" and ready["side"] == "vapo-lab" and ready["reference_model"]
        )
        assert ready["threads"] == 1 and 1.0e6 < ready["policy_params"] < 1.2e6
        worker.send(cmd="run", steps=2)
        done = worker.recv(timeout=300)
    finally:
        worker.close()
    assert done["event"] == "done" and len(done["seconds"]) == len(done["tokens"]) == 2
    assert all(s > 0 for s in done["seconds"]) and done["rss_mib"] > 50
    # every completion has 1..4 tokens (eos counted)
    assert all(
        small_spec.completions <= t <= small_spec.completions * small_spec.max_new_tokens
        for t in done["tokens"]
    )
