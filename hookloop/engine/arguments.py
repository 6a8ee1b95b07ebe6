"""The Trainer's arguments checked before anything is built: a bad value, a contradiction or
an MMCV 1.x config key is refused here, so a failed ``Trainer(...)`` leaves nothing behind.
"""
import importlib
import inspect
import random

import torch

from ..checkpoint.resume_changes import RESUME_POLICIES
from ..checkpoint.sharded_files import is_sharded_checkpoint
from ..dist.fsdp import is_sharded_model
from ..dist.process_group import broadcast_object
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


def argument_names(trainer_class):
    """The names of the arguments ``trainer_class`` takes."""
    return [name for name in inspect.signature(trainer_class.__init__).parameters if name not in ('self', 'mmcv_keys')]


def check_arguments(trainer_class, unknown, custom_imports, evaluation):
    """Refuse MMCV keys and unknown names (``unknown``: the names ``trainer_class`` does not
    take) and import ``custom_imports``."""
    if unknown or needs_translation({'custom_imports': custom_imports, 'evaluation': evaluation}):
        raise refuse_untranslated({'custom_imports': custom_imports, 'evaluation': evaluation}, unknown,
                                  argument_names(trainer_class))
    import_custom_modules(custom_imports)


def import_custom_modules(custom_imports):
    """Import ``custom_imports`` (a module name or a list of them): they register models,
    datasets, hooks."""
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


def check_resume_arguments(resume_from, load_from, resume_policy):
    """``resume_from`` and ``load_from`` exclude each other and name files that exist."""
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


def run_seed(seed):
    """``(seed, given)``: ``seed``, or one drawn on rank 0 and shared with all ranks when it is None."""
    if seed is None:
        return broadcast_object(random.SystemRandom().randrange(2 ** 31)), False
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f'seed must be an int or None, got {seed!r}')
    return seed, True


def check_train_step_model(model, world_size, strategy):
    """Refuse a model with an MMCV ``train_step`` under DDP/FSDP (called before wrapping it)."""
    if world_size > 1 and strategy != 'none':
        raise ConfigError(f'{type(model).__name__} has an MMCV train_step: it is called directly, bypassing '
                          'the DDP/FSDP wrapper, so gradients would not be synchronised across ranks; '
                          'run it single-process or give the model a forward that returns the losses')


def check_model_swap(model, started, world_size):
    """Refuse what ``Trainer.set_model`` cannot do. The optimizer keeps the parameters it was built
    with, as in MMCV, and the new model is not compiled; but the hooks set up with the old model keep
    it (so only before the first run) and the DDP/FSDP wrapper is the old model's (one process only)."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f'set_model needs a torch.nn.Module, got {type(model).__name__}')
    if started:
        raise ConfigError('the model cannot be replaced once a run has begun (the hooks were set up with it); '
                          'build a new trainer')
    if world_size > 1:
        raise ConfigError('the model cannot be replaced in a distributed run (it is wrapped for every rank); '
                          'build a new trainer')


def check_sharded_optimizer(wrapped_model, optimizer):
    """Refuse an optimizer built before FSDP sharded the parameters it holds."""
    if is_sharded_model(wrapped_model) and isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError('strategy="fsdp" replaces the parameters with sharded ones: pass the optimizer '
                          'as a config dict (e.g. dict(type="AdamW", lr=1e-3)), not a built optimizer')


__all__ = ['argument_names', 'check_arguments', 'check_model_swap', 'import_custom_modules', 'check_sharded_optimizer', 'check_resume_arguments', 'check_run_length',
           'check_train_step_model', 'positive_int', 'run_seed']
