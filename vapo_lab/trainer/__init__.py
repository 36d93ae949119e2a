"""The built-in PPO trainer (VAPO, PPO, DAPO, GRPO).

``trainer`` holds the :class:`~vapo_lab.trainer.trainer.Trainer`; ``setup`` builds a run's parts;
``phases`` runs a step's phases over them: ``collect`` (rollouts, scored by ``scoring``),
``forward`` (log-probs and values), ``advantages``, ``update`` (one descent skeleton for actor,
critic and reward model); ``caches`` starts the critic (reward model, value pretraining) through
the same phases; ``metrics`` and ``diagnostics`` are a step's statistics, ``evaluation`` the
periodic held-out avg@k, ``checkpointer`` and ``record`` the run's checkpoints, folder and tracking.
"""
