"""Bounds on what loading a config may cost, each refused in one line when it is hit.

A config may come from elsewhere (a model hub's ``configuration.json``, a YAML file someone
sent): a few hundred bytes of YAML aliases expand into millions of values (each alias of a list
of aliases multiplies), and ``_base_`` files that name each other twice double the work per
level. Every config file is therefore read under these limits:

* a ``.json`` / ``.yaml`` file is at most :data:`MAX_FILE_BYTES`;
* a file's values, counted with every alias expanded (as merging, ``Config`` and the
  checkpoint's ``meta['config']`` would expand them), are at most :data:`MAX_VALUES`, nested at
  most :data:`MAX_DEPTH` deep -- and so is the merged config;
* one load reads at most :data:`MAX_FILES` files (each ``_base_`` counted every time it is
  named) along chains of at most :data:`MAX_BASE_DEPTH` ``_base_`` links.

Real configs stay far below: MMCV's largest hold a few thousand values in under 20 files.
"""
from ..errors import ConfigError

MAX_FILE_BYTES = 4 << 20
MAX_VALUES = 100_000
MAX_DEPTH = 64
MAX_FILES = 64
MAX_BASE_DEPTH = 16


def check_expansion(data, path, what='config'):
    """Refuse ``data`` (a loaded config) holding more than :data:`MAX_VALUES` values or nested
    deeper than :data:`MAX_DEPTH`, shared (aliased) values counted at every place they appear.
    Stops counting at the bound, so a billion-laughs file costs no more than a real one."""
    count, todo = 0, [(data, 1)]
    while todo:
        value, depth = todo.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(f'{what} {path!r} expands to more than {MAX_VALUES} values (YAML aliases or '
                              '_base_ files repeating each other?): refusing it')
        if depth > MAX_DEPTH:
            raise ConfigError(f'{what} {path!r} nests values more than {MAX_DEPTH} deep: refusing it')
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for v in value.values())
            count += len(value)  # the keys
        elif isinstance(value, (list, tuple)):
            todo.extend((v, depth + 1) for v in value)


def read_text(path):
    """The text of a ``.json`` / ``.yaml`` config, refused beyond :data:`MAX_FILE_BYTES`."""
    with open(path, 'rb') as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f'config {path!r} is larger than {MAX_FILE_BYTES >> 20} MiB: refusing to read it')
    return data.decode('utf-8')


class LoadBudget:
    """The files one :func:`hookloop.config.loader.load_config` call may still read."""

    def __init__(self):
        self.files = 0

    def take(self, path, chain):
        """Count the read of ``path``, reached through the ``_base_`` links ``chain``."""
        self.files += 1
        if self.files > MAX_FILES:
            raise ConfigError(f'config {chain[0]!r} reads more than {MAX_FILES} files through _base_ (a base '
                              f'named many times over?): refusing it at {path!r}')
        if len(chain) > MAX_BASE_DEPTH:
            raise ConfigError(f'config {chain[0]!r} chains _base_ more than {MAX_BASE_DEPTH} files deep: '
                              f'refusing it at {path!r}')
