"""The built-in PPO trainer (VAPO, PPO, DAPO, GRPO), one module per phase of a step.

``run`` (a run: setup from ``setup``, its folder and tracking in ``record``) drives ``loop``
(the loop and one step), whose phases are ``collect`` (rollouts) and ``scoring`` (the reward),
``advantages``, ``update`` (critic and actor gradient steps over ``forward``'s passes), then
``evaluation`` (periodic held-out avg@k) and ``checkpoints``; ``critic_init`` is where the critic
starts and ``diagnostics`` the per-step ``diag/*`` metrics.
"""
