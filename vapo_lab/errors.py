"""The exceptions vapo-lab raises on bad input; the CLI prints their message on one line."""


class VapoLabError(Exception):
    """Base of every error meant for the user: the message names the bad value and the fix."""


class ConfigError(VapoLabError):
    """A config could not be composed or is invalid (unknown name, bad override, bad value)."""


class UnknownComponentError(ConfigError):
    """A component name that is not one of the seven."""


class CheckpointError(VapoLabError):
    """A checkpoint or cache file that vapo-lab refuses to load (unsafe or corrupt)."""
