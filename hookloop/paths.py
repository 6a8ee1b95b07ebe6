"""Directories hookloop writes to, checked before any training starts."""
import os

from .errors import ConfigError


def ensure_writable_dir(path, what):
    """Create ``path`` and prove it writable, or raise ConfigError naming ``what``."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f'.write_test_{os.getpid()}')
        with open(probe, 'w'):
            pass
        os.remove(probe)
    except OSError as exc:
        raise ConfigError(f'{what} {path!r} is not writable: {exc.strerror or exc}') from None
    return path
