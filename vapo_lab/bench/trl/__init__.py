"""Benchmark of one RL step through vapo-lab's trainer and through TRL, on CPU, interleaved.

``vapo-lab bench trl`` (or ``python -m vapo_lab.bench.trl``) times the same work on both sides
(:class:`~vapo_lab.bench.trl.spec.BenchSpec`): a ~1.1M-parameter Qwen2 policy (``build_tiny_model``
with the embedded tokenizer, random init, saved with ``save_pretrained`` so that every side loads
the very same weights), fp32, 2 torch threads, 64 completions of at most 32 new tokens per step,
sampling at temperature 1 with stop at end-of-sequence, one PPO epoch of 4 optimiser steps on
mini-batches of 16, and a rule-based reward: the arith task's verifier (10-digit additions, so
every prompt has 22 tokens).

  (a) vapo-lab PPO and VAPO against TRL's ``PPOTrainer`` (removed in TRL 1.13: run from
      ``trl==1.12.0`` in its own virtual env). PPOTrainer takes the reward model and the value
      model as modules: the verifier is wrapped as a "reward model" and the value model is a
      Qwen2 of the policy's size with a scalar head, started from the policy's weights, like
      vapo-lab's ``critic.init=policy``.
  (b) vapo-lab GRPO against TRL's ``GRPOTrainer`` (8 prompts x 8 samples), reward function = the
      verifier, in a second env (``trl==1.16.0``, pinned so that ratios stay comparable between
      runs; it cannot share the 1.12 env).

Every side is a persistent worker process driven over a pipe (JSON lines, :mod:`.protocol`): our
side (:mod:`.ours`) runs ``vapo_lab.trainer.trainer.Trainer.train_step``, the trainer's own step (sampler,
grader, critic values, GAE / group advantages, critic and actor updates with their optimisers),
on a ``Trainer`` built from a composed config; a TRL side (:mod:`.theirs`) runs ``trainer.train()``
and a callback stops it at every step boundary until the driver says go. The driver
(:mod:`.run`) interleaves steps of all sides, rotating the order every round, so machine drift
hits them alike. The TRL workers run in the TRL envs' interpreters, which execute
``__main__.py`` by path; of vapo-lab they import only this package's worker-side modules
(:mod:`.spec`, :mod:`.protocol`, :mod:`.envs`, :mod:`.theirs`), its errors and the arith task, all
standard library only, loaded from this source tree without installing vapo-lab there.

Setup of the TRL envs (once; about a minute from the local torch wheel and PyPI, :mod:`.envs`)::

    vapo-lab bench trl --setup

which runs, for each env (``.bench-venv/trl112`` with trl==1.12.0, ``.bench-venv/trl-latest``
with trl==1.16.0)::

    python -m venv .bench-venv/trl112
    .bench-venv/trl112/bin/pip install torch==2.13.0
    .bench-venv/trl112/bin/pip install trl==1.12.0

Where the two sides' work differs, the printout says so
(:func:`~vapo_lab.bench.trl.run.format_trl_benchmark`).

Read the load average it prints: with other processes on the cores, a 2-thread step waits for
descheduled threads at every parallel region, and the side with more small ops (TRL's PPOTrainer
above all) slows down most (docs/benchmarks.md#rl-step-against-trl). ``--threads 1`` gives stable
ratios there.
"""
