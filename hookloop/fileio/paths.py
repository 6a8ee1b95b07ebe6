"""Directories hookloop writes to, checked before any training starts."""
import os

from ..errors import ConfigError


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


def check_can_create_dir(path, what):
    """Raise ConfigError unless ``path`` is a directory or could be created as one; creates
    nothing (a config error found later must not leave an empty work dir behind)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ConfigError(f'{what} {path!r} is a file, not a directory')
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f'{what} {path!r} is not writable')
        return path
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f'{what} {path!r} is not writable: it cannot be created, {parent!r} is a file')
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f'{what} {path!r} is not writable: it cannot be created in {parent!r}')
    return path
