"""The built-in PPO trainer (VAPO, PPO, DAPO, GRPO).

``trainer`` holds the :class:`~vapo_lab.trainer.trainer.Trainer`: set-up, ``train()`` and
``train_step()``, whose phases are ``collect`` (rollouts) and ``scoring`` (the reward), ``forward``
(log-probs and values), ``advantages``, ``update`` (critic and actor gradient steps), then
``metrics``; ``evaluation`` is the periodic held-out avg@k, ``checkpointer`` saves and loads the
stateful parts it is handed, ``record`` is the run's folder and tracking run, ``setup`` the named
pieces a run is built from, ``critic_init`` where the critic starts and ``diagnostics`` the
per-step ``diag/*`` statistics.
"""
