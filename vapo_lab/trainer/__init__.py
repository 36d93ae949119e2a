"""The built-in PPO trainer (VAPO, PPO, DAPO, GRPO): loop, forward passes, critic init, checkpoints."""
