"""The MMCV runners (``EpochBasedRunner``, ``IterBasedRunner``, ``build_runner``) over one
:class:`~hookloop.Trainer` each; see :mod:`hookloop.compat.mmcv`."""
import logging
import os
import warnings

import torch
from torch import nn

from ...errors import ConfigAssertionError, ConfigError, ConfigTypeError
from ...hooks import EvaluationHook
from ...registry import Registry
from ..log_vars_evaluator import LogVarsEvaluator
from ..mmcv_config import iter_based_defaults
from .parallel import is_module_wrapper
from .trainer import LATEST_LINK, MMCVTrainer, link_latest  # noqa: F401 (mmcv.runner's names)

RUNNERS = Registry('runner')


class _BatchProcessorModel(nn.Module):
    """MMCV's deprecated ``batch_processor(model, data, train_mode)`` as a model's
    ``train_step`` / ``val_step``; its weights (and checkpoint keys) are the user model's."""

    def __init__(self, module, batch_processor):
        super().__init__()
        self.module, self.batch_processor = module, batch_processor

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def train_step(self, data_batch, optimizer=None, **kwargs):
        return self.batch_processor(self.module, data_batch, train_mode=True, **kwargs)

    def val_step(self, data_batch, optimizer=None, **kwargs):
        return self.batch_processor(self.module, data_batch, train_mode=False, **kwargs)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, **kwargs):
        return self.module.load_state_dict(state_dict, strict=strict, **kwargs)


class _BothStepsError(ConfigError, RuntimeError):
    """MMCV raises RuntimeError here."""


def _check_runner_arguments(model, batch_processor, optimizer, work_dir, logger, meta, max_iters, max_epochs):
    """MMCV BaseRunner's checks, with its exception types (and hookloop's ConfigError)."""
    if batch_processor is not None:
        if not callable(batch_processor):
            raise ConfigTypeError(f'batch_processor must be callable, but got {type(batch_processor).__name__}')
        warnings.warn('batch_processor is deprecated, please implement train_step() and val_step() in the '
                      'model instead.', UserWarning)
        if is_module_wrapper(model) and hasattr(model.module, 'train_step') or hasattr(model, 'train_step'):
            raise _BothStepsError('batch_processor and model.train_step()/model.val_step() cannot be both '
                                  'available.')
    elif not hasattr(model, 'train_step') and type(model).forward is nn.Module.forward:
        # MMCV asserts train_step; hookloop also trains a model whose forward returns the losses
        raise ConfigAssertionError('the model must have a train_step(data_batch, optimizer) method, a forward '
                                   'that returns the losses, or a batch_processor')
    optimizers = optimizer.values() if isinstance(optimizer, dict) else [] if optimizer is None else [optimizer]
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigTypeError(f'optimizer must be a torch.optim.Optimizer or a dict of them, got '
                                  f'{type(opt).__name__}')
    if not isinstance(logger, logging.Logger):
        raise ConfigTypeError(f'logger must be a logging.Logger object, but got {type(logger).__name__}')
    if meta is not None and not isinstance(meta, dict):
        raise ConfigTypeError(f'meta must be a dict or None, but got {type(meta).__name__}')
    if work_dir is not None and not isinstance(work_dir, (str, os.PathLike)):
        raise ConfigTypeError('"work_dir" must be a str or None')
    if max_epochs is not None and max_iters is not None:
        raise ConfigError('Only one of `max_epochs` or `max_iters` can be set.')


class BaseRunner:
    """MMCV's runner constructor and methods over a Trainer built at once (without data:
    the loaders come with :meth:`run`)."""

    by_epoch = True
    filename_tmpl = 'epoch_{}.pth'

    def __init__(self, model, batch_processor=None, optimizer=None, work_dir=None, logger=None, meta=None,
                 max_iters=None, max_epochs=None):
        _check_runner_arguments(model, batch_processor, optimizer, work_dir, logger, meta, max_iters, max_epochs)
        if batch_processor is not None:
            model = _BatchProcessorModel(model, batch_processor)
        parameters = list(model.parameters())
        device = parameters[0].device if parameters else 'cpu'  # MMCV leaves the model where the user put it
        if work_dir is not None:
            os.makedirs(work_dir, exist_ok=True)  # MMCV makes it at once
        trainer = MMCVTrainer(model, optimizer=optimizer, work_dir=os.fspath(work_dir or 'work_dirs/default'),
                              seed=(meta or {}).get('seed'), device=device, iter_based_runner=not self.by_epoch,
                              runner_meta=meta,
                              # MMDistributedDataParallel's, for the trainer's DDP under torchrun
                              find_unused_parameters=getattr(model, 'find_unused_parameters', False))
        object.__setattr__(self, 'trainer', trainer)
        self.user_logger = logger  # MMCV code may log to its own logger; the run logs to trainer.logger
        self._max_epochs, self._max_iters = max_epochs, max_iters

    # Attributes hooks and scripts assign that are the Trainer's state.
    _TRAINER_ATTRIBUTES = ('meta',)

    def __setattr__(self, name, value):
        if name in ('_epoch', '_iter'):  # MMCV tests and scripts set the counters to continue a run
            self._set_counter(name[1:], value)
        elif name in self._TRAINER_ATTRIBUTES:
            setattr(self.trainer, name, value)
            if name == 'meta':
                self.trainer.runner_meta = value
        else:
            object.__setattr__(self, name, value)

    def _set_counter(self, name, value):
        # MMCV's _iter is the global count (its _inner_iter is another counter); for an
        # iteration-based run, run() places it in the passes over the loader once it has one
        setattr(self.trainer.position, name, value)
        if name == 'iter':
            object.__setattr__(self, '_iter_assigned', True)

    _iter_assigned = False

    def _place_assigned_iter(self):
        """``runner._iter = n`` before an iteration-based run: the pass over the loader and the
        place in it the n-th iteration falls on."""
        position = self.trainer.position
        position.epoch, position.inner_iter = divmod(position.iter, self.trainer.iters_per_epoch)

    @property
    def model(self):
        model = self.trainer.model
        return model.module if isinstance(model, _BatchProcessorModel) else model

    @model.setter
    def model(self, model):
        """Swap the model before a run (MMCV scripts assign ``runner.model``): :meth:`Trainer.set_model`."""
        self.trainer.set_model(model)

    # The run's state is the Trainer's: epoch, iter, inner_iter, optimizer, logger, meta,
    # work_dir, hooks, outputs, rank, world_size, data_loader, log_buffer, register_*_hook, ...
    def __getattr__(self, name):
        if name == 'trainer':
            raise AttributeError(name)
        return getattr(self.trainer, name)

    @property
    def max_epochs(self):
        return self._max_epochs if self.trainer.train_dataloader is None else self.trainer.max_epochs

    @property
    def max_iters(self):
        return self._max_iters if self.trainer.train_dataloader is None else self.trainer.max_iters

    @property
    def model_name(self):
        return type(self.model).__name__

    def register_hook(self, hook, priority='NORMAL'):
        return self.trainer.register_hook(hook, priority=priority)

    def register_training_hooks(self, lr_config=None, optimizer_config=None, checkpoint_config=None,
                                log_config=None, momentum_config=None, timer_config=dict(type='IterTimerHook'),
                                custom_hooks_config=None):
        self.trainer.register_training_hooks(lr_config, optimizer_config, checkpoint_config, log_config,
                                             momentum_config, timer_config, custom_hooks_config)

    def run(self, data_loaders, workflow, max_epochs=None, max_iters=None, **kwargs):
        """``data_loaders[i]`` goes with ``workflow[i]``: ``[('train', n)]``, optionally with
        ``('val', k)``, which validates every ``n`` epochs (iterations) with ``val_step``."""
        if len(data_loaders) != len(workflow):
            raise ConfigError(f'run() got {len(data_loaders)} data loaders for a workflow of {len(workflow)}')
        modes = [mode for mode, _ in workflow]
        if modes.count('train') != 1 or set(modes) - {'train', 'val'}:
            raise ConfigError(f"workflow {workflow!r}: give one ('train', n) and optionally ('val', k)")
        length_key = 'max_epochs' if self.by_epoch else 'max_iters'
        length = (max_epochs if self.by_epoch else max_iters) or getattr(self, f'_{length_key}')
        if length is None:
            raise ConfigError(f'{type(self).__name__} needs {length_key} (in the constructor or in run())')
        trainer = self.trainer
        train_index = modes.index('train')
        if 'val' in modes:
            trainer.set_validation(data_loaders[modes.index('val')],
                                   LogVarsEvaluator() if trainer.val_evaluator is None else None)
            if not any(getattr(h, 'ROLE', None) == 'evaluation' for h in trainer.hooks):
                trainer.register_hook(EvaluationHook(interval=workflow[train_index][1], by_epoch=self.by_epoch))
        trainer.set_train_dataloader(data_loaders[train_index], **{length_key: length})
        if self._iter_assigned and not self.by_epoch:
            self._place_assigned_iter()
        return trainer.train()

    def resume(self, checkpoint, resume_optimizer=True, map_location='default'):
        """Continue exactly from ``checkpoint`` (:meth:`MMCVTrainer.resume`)."""
        return self.trainer.resume(checkpoint, resume_optimizer, map_location)

    def load_checkpoint(self, filename, map_location='cpu', strict=False, revise_keys=((r'^module\.', ''),)):
        """Load weights only, renaming keys with ``revise_keys`` first; returns the checkpoint."""
        return self.trainer.load_checkpoint(filename, map_location, strict, revise_keys)

    def save_checkpoint(self, out_dir, filename_tmpl=None, save_optimizer=True, meta=None, create_symlink=True):
        """``<out_dir>/epoch_<n>.pth`` (``iter_<n>.pth``) and ``latest.pth`` (:meth:`MMCVTrainer.save_checkpoint`)."""
        return self.trainer.save_checkpoint(out_dir, filename_tmpl or self.filename_tmpl, save_optimizer, meta,
                                            create_symlink)

    def current_lr(self):
        return self.trainer.current_lr()


@RUNNERS.register_module()
class EpochBasedRunner(BaseRunner):
    """MMCV's ``EpochBasedRunner(model, optimizer=, work_dir=, logger=, meta=, max_epochs=)``."""


@RUNNERS.register_module()
class IterBasedRunner(BaseRunner):
    """MMCV's ``IterBasedRunner(model, optimizer=, work_dir=, logger=, meta=, max_iters=)``; the
    loader is cycled, checkpoints are ``iter_{n}.pth``."""

    by_epoch = False
    filename_tmpl = 'iter_{}.pth'

    def run(self, data_loaders, workflow, max_iters=None, **kwargs):
        """MMCV's ``IterBasedRunner.run(data_loaders, workflow, max_iters=None)``."""
        return super().run(data_loaders, workflow, max_iters=max_iters, **kwargs)

    def register_training_hooks(self, lr_config=None, optimizer_config=None, checkpoint_config=None,
                                log_config=None, momentum_config=None, timer_config=dict(type='IterTimerHook'),
                                custom_hooks_config=None):
        """MMCV's: the LR, momentum, checkpoint and logger hooks count iterations
        (``by_epoch=False``) unless their config says otherwise."""
        configs = iter_based_defaults(lr_config, momentum_config, checkpoint_config, log_config)
        super().register_training_hooks(configs['lr_config'], optimizer_config, configs['checkpoint_config'],
                                        configs['log_config'], configs['momentum_config'], timer_config,
                                        custom_hooks_config)


def build_runner(cfg, default_args=None):
    """MMCV's ``build_runner(dict(type='EpochBasedRunner', max_epochs=12), default_args=dict(model=...))``."""
    cfg = dict(cfg)
    cfg.pop('constructor', None)  # MMCV's DefaultRunnerConstructor: nothing else to construct
    return RUNNERS.build(cfg, default_args=default_args)
