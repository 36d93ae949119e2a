"""Config: the typed schema, the one compose function, whole-config validation, the plan of a run
(what it needs against what the devices have) and the pre-flight checks.

``compose_config`` lives in ``vapo_lab.config.compose`` (imported by callers when they need it:
composing pulls in Hydra).
"""
