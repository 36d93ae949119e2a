"""Evaluation: benchmarks, avg@k / pass@k / maj@k, and the harness that samples and grades a model.

``harness.evaluate_model`` samples and grades a model, ``responses.grade_responses`` grades
responses made elsewhere; the grader itself is ``vapo_lab.grading``, shared with the training
reward. How to run it and what the figures mean: docs/evaluation.md.
"""

from __future__ import annotations

from vapo_lab.eval.benchmarks import BENCHMARKS, Benchmark, load_benchmark
from vapo_lab.eval.metrics import (
    avg_at_k,
    avg_at_k_se,
    bootstrap_ci,
    maj_at_k,
    pass_at_k,
    pass_at_k_table,
)

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "avg_at_k",
    "avg_at_k_se",
    "bootstrap_ci",
    "load_benchmark",
    "maj_at_k",
    "pass_at_k",
    "pass_at_k_table",
]
