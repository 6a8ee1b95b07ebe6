"""``mmcv.utils``: the helpers of MMCV's that repository code imports beside the runner
(``build_from_cfg``, ``print_log``, ``get_logger``, ``scandir``, ``TORCH_VERSION``,
``Registry``), over hookloop's registries and logging."""
import logging
import os
import sys
from collections.abc import Mapping

import torch

from ....dist.process_group import get_rank
from ....errors import ConfigError, ConfigTypeError
from ....registry import Registry

TORCH_VERSION = torch.__version__


class RegistryKeyError(ConfigError, KeyError):
    """MMCV raises KeyError for a config without ``type`` or a name not registered."""

    def __str__(self):  # a KeyError would show its message quoted
        return str(self.args[0])


def build_from_cfg(cfg, registry, default_args=None):
    """MMCV's ``build_from_cfg(cfg, registry, default_args=None)``: ``registry``'s entry named
    ``cfg['type']`` (or a class given as ``type``), called with the other keys and the
    missing ones from ``default_args``. MMCV's exception types (TypeError for a non-dict,
    KeyError for a missing or unknown type), each also a hookloop ``ConfigError``."""
    if not isinstance(cfg, Mapping):
        raise ConfigTypeError(f'cfg must be a dict, but got {type(cfg).__name__}')
    if default_args is not None and not isinstance(default_args, Mapping):
        raise ConfigTypeError(f'default_args must be a dict or None, but got {type(default_args).__name__}')
    if not isinstance(registry, Registry):
        raise ConfigTypeError(f'registry must be a hookloop Registry object, but got {type(registry).__name__}')
    cfg = dict(cfg)
    if 'type' not in cfg:
        if default_args is None or 'type' not in default_args:
            raise RegistryKeyError(f'`cfg` or `default_args` must contain the key "type", but got {cfg}')
        cfg['type'] = default_args['type']
    defaults = {k: v for k, v in (default_args or {}).items() if k != 'type'}
    if isinstance(cfg['type'], str) and cfg['type'] not in registry:
        try:
            registry.get(cfg['type'])
        except ConfigError as exc:
            raise RegistryKeyError(str(exc)) from None
    return registry.build(cfg, default_args=defaults)


def get_logger(name, log_file=None, log_level=logging.INFO, file_mode='w'):
    """A logger printing to stdout (and ``log_file``) in MMCV's format; on ranks other than 0
    only errors."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        formatter = logging.Formatter('%(asctime)s - %(name)s - %(levelname)s - %(message)s')
        handlers = [logging.StreamHandler(sys.stdout)]
        if log_file is not None and get_rank() == 0:
            handlers.append(logging.FileHandler(log_file, file_mode))
        for handler in handlers:
            handler.setFormatter(formatter)
            logger.addHandler(handler)
    logger.setLevel(log_level if get_rank() == 0 else logging.ERROR)
    return logger


def print_log(msg, logger=None, level=logging.INFO):
    """MMCV's ``print_log``: ``print`` without a logger, nothing for ``'silent'``, else the
    logger (an object or a name for :func:`get_logger`) at ``level``."""
    if logger is None:
        print(msg)
    elif isinstance(logger, logging.Logger):
        logger.log(level, msg)
    elif logger == 'silent':
        pass
    elif isinstance(logger, str):
        get_logger(logger).log(level, msg)
    else:
        raise ConfigTypeError(f'logger should be either a logging.Logger object, str, "silent" or None, '
                              f'but got {type(logger).__name__}')


def scandir(dir_path, suffix=None, recursive=False, case_sensitive=True):
    """MMCV's ``scandir``: the paths (relative to ``dir_path``) of the files in it whose name
    ends with ``suffix`` (a str or a tuple), sub-directories too with ``recursive``."""
    if suffix is not None and not isinstance(suffix, (str, tuple)):
        raise ConfigTypeError('"suffix" must be a string or tuple of strings')
    if suffix is not None and not case_sensitive:
        suffix = suffix.lower() if isinstance(suffix, str) else tuple(s.lower() for s in suffix)
    root = os.fspath(dir_path)

    def scan(path):
        for entry in os.scandir(path):
            if entry.is_file() and not entry.name.startswith('.'):
                relative = os.path.relpath(entry.path, root)
                name = relative if case_sensitive else relative.lower()
                if suffix is None or name.endswith(suffix):
                    yield relative
            elif recursive and entry.is_dir():
                yield from scan(entry.path)
    return scan(root)


__all__ = ['TORCH_VERSION', 'Registry', 'build_from_cfg', 'get_logger', 'print_log', 'scandir']
