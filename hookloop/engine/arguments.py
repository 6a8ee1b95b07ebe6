"""The Trainer's arguments checked before anything is built: a bad value, a contradiction or
an MMCV 1.x config key is refused here, so a failed ``Trainer(...)`` leaves nothing behind.
"""
import importlib

from ..checkpoint.resume_changes import RESUME_POLICIES
from ..dist.fsdp import is_sharded_checkpoint
from ..errors import CheckpointError, ConfigError
from ..fileio import storage
from .runner_names import needs_translation, refuse_untranslated


def positive_int(name, value):
    """``value`` if it is None or an int >= 1, else a ConfigError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'{name} must be a positive int, got {value!r}')
    return value


def check_run_length(max_epochs, max_iters):
    """Exactly one of ``max_epochs`` and ``max_iters`` (each a positive int)."""
    if (max_epochs is None) == (max_iters is None):
        raise ConfigError('give exactly one of max_epochs and max_iters '
                          f'(got max_epochs={max_epochs!r}, max_iters={max_iters!r})')
    return positive_int('max_epochs', max_epochs), positive_int('max_iters', max_iters)


def check_arguments(trainer_class, unknown, custom_imports, evaluation, resume_from, load_from, resume_policy):
    """Refuse MMCV keys and unknown names (``unknown``: the names ``trainer_class`` does not
    take), import ``custom_imports`` (they register models, datasets, hooks) and check the
    resume arguments."""
    if unknown or needs_translation({'custom_imports': custom_imports, 'evaluation': evaluation}):
        raise refuse_untranslated({'custom_imports': custom_imports, 'evaluation': evaluation}, unknown,
                                  trainer_class.arguments())
    modules = [custom_imports] if isinstance(custom_imports, str) else custom_imports or []
    if not isinstance(modules, (list, tuple)):
        raise ConfigError(f'custom_imports must be a module name or a list of them, got {custom_imports!r}')
    for module in modules:
        if not isinstance(module, str):
            raise ConfigError(f'custom_imports must be module names (strings), got {module!r}')
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f'custom_imports: cannot import {module!r}: {exc}') from None
    if resume_from not in (None, 'auto') and load_from is not None:
        raise ConfigError('resume_from and load_from exclude each other: resume continues a run, '
                          'load_from starts a new one from its weights (with resume_from="auto", '
                          'load_from is used only when there is nothing to resume)')
    for name, path in (('resume_from', resume_from), ('load_from', load_from)):
        sharded = name == 'resume_from' and path is not None and is_sharded_checkpoint(path)  # FSDP dir
        if path is not None and path != 'auto' and not (storage.isfile(path) or sharded):
            raise CheckpointError(f'{name} {path!r} does not exist or is not a file')
    if resume_policy not in RESUME_POLICIES:
        raise ConfigError(f'resume_policy must be one of {list(RESUME_POLICIES)}, got {resume_policy!r}')


__all__ = ['check_arguments', 'check_run_length', 'positive_int']
