"""Config: the typed schema, the one compose function, whole-config validation and preflight checks.

``compose_config`` lives in ``vapo_lab.config.compose`` (imported by callers when they need it:
composing pulls in Hydra).
"""
