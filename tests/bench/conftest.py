"""The shared model and a small step of the vapo-lab vs TRL benchmark tests, built once."""

import pytest

from vapo_lab.bench.trl.run import build_bench_model
from vapo_lab.bench.trl.spec import BenchSpec


@pytest.fixture(scope="session")
def small_spec() -> BenchSpec:
    """8 completions of <= 4 tokens, 2-digit problems: a step takes well under a second."""
    return BenchSpec(
        completions=8,
        max_new_tokens=4,
        group_size=4,
        mini_batch_size=4,
        threads=1,
        digits=2,
        n_problems=32,
    )


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-model")
    build_bench_model(path, seed=0)
    return path
