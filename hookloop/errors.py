"""One exception hierarchy for everything hookloop refuses or cannot do.

The CLI prints the message of a :class:`HookloopError` as one line and exits
non-zero; anything else is a bug and keeps its traceback.
"""


class HookloopError(Exception):
    """Base class of every error hookloop raises on purpose."""


class ConfigError(HookloopError, ValueError):
    """A configuration value, type name or argument that cannot be used."""


class CheckpointError(HookloopError):
    """A checkpoint that cannot be written, found or trusted."""


class InvalidLossError(HookloopError, FloatingPointError):
    """The loss became NaN or infinite."""


class DataError(HookloopError):
    """A dataset or data loader that cannot feed training (e.g. empty)."""


class ConfigTypeError(ConfigError, TypeError):
    """A ConfigError for a value of the wrong type; also a ``TypeError``, as MMCV raises there."""


class ConfigAssertionError(ConfigError, AssertionError):
    """A ConfigError where MMCV ``assert``\\ s; also an ``AssertionError`` (``hookloop.compat.mmcv``)."""
