"""Evaluation: benchmarks, avg@k / pass@k / maj@k, and the harness that samples and grades a model.

``settings`` (how samples are drawn), ``model_ref`` (what ``--model`` names), ``benchmarks``
(what is evaluated), ``loading`` (tokenizer, policy, sampler), ``scoring`` (grading and metrics),
``files`` (the resumable output folder), ``tracking`` (MLflow), ``harness`` (``evaluate_model``)
and ``responses`` (``grade_responses``). The answer grader itself is ``vapo_lab.grading``
(shared with the training reward).
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
