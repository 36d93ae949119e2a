"""Benchmarks one RL step through vapo-lab's trainer and through TRL, on CPU, interleaved.

``vapo-lab bench trl`` (or ``python -m vapo_lab.bench.trl``) times the same work on every side
(:class:`~vapo_lab.bench.trl.spec.BenchSpec`): vapo-lab PPO and VAPO against TRL's ``PPOTrainer``
(removed in TRL 1.13: run from ``trl==1.12.0``), and vapo-lab GRPO against TRL's ``GRPOTrainer``
(``trl==1.16.0``), each TRL release in its own env under ``.bench-venv/`` (created once by
``vapo-lab bench trl --setup``, :mod:`.envs`).

Every side is a persistent worker process driven over a pipe (:mod:`.protocol`): ours
(:mod:`.ours`) runs the trainer's own ``Trainer.train_step``; a TRL side (:mod:`.theirs`) runs
``trainer.train()`` and a callback stops it at every step boundary until the driver (:mod:`.run`)
says go. The TRL workers run in the TRL envs' interpreters and import of vapo-lab only this
package's worker-side modules, its errors and the arith task (all standard library only), loaded
from this source tree. Setup, method and results: docs/benchmarks.md#rl-step-against-trl.
"""
