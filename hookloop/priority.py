"""Hook priorities: MMCV's names and values; a lower value runs first."""
from enum import IntEnum

from .errors import ConfigError


class Priority(IntEnum):
    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def get_priority(priority):
    """Return the integer value of ``priority`` (an int in 0..100, a name or a Priority)."""
    if isinstance(priority, bool):
        raise ConfigError(f'priority must be an int or a Priority name, got {priority!r}')
    if isinstance(priority, int):
        if not 0 <= priority <= 100:
            raise ConfigError(f'priority must be between 0 and 100, got {priority}')
        return int(priority)
    if isinstance(priority, str):
        try:
            return Priority[priority.upper()].value
        except KeyError:
            names = ', '.join(p.name for p in Priority)
            raise ConfigError(f'unknown priority {priority!r}; use an int or one of {names}') from None
    raise ConfigError(f'priority must be an int or a Priority name, got {type(priority).__name__}')
