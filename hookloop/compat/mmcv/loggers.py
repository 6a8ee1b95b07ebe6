"""Logger hooks MMCV has and hookloop's native set does not: ``PaviLoggerHook`` (with
MMCV's tag names), and the ones refused with a pointer to a native hook.

MMCV's loggers name the schedule values ``learning_rate`` / ``momentum`` (``/<name>`` per
optimizer of a dict) and log a train-step model's ``log_vars`` only; :func:`mmcv_tags`
builds that dict from a hookloop log record.
"""
from ...engine.model_step import has_train_step
from ...errors import ConfigError
from ...hooks import Hook, LoggerHook
from ...hooks.loggers.base import require
from ...hooks.momentum_updater import group_momentum
from ...registry import HOOKS

_POSITION_KEYS = ('mode', 'epoch', 'iter', 'inner_iter', 'time', 'data_time', 'lr', 'momentum', 'memory')


def _schedule_tags(optimizer):
    def first(opt, read):
        return read(opt.param_groups[0]) if opt.param_groups else None
    tags = {}
    optimizers = optimizer.items() if isinstance(optimizer, dict) else [(None, optimizer)]
    for name, opt in optimizers:
        if opt is None:
            continue
        suffix = '' if name is None else f'/{name}'
        tags[f'learning_rate{suffix}'] = first(opt, lambda g: g['lr'])
        try:
            tags[f'momentum{suffix}'] = first(opt, group_momentum)
        except KeyError:  # an optimizer without momentum / betas
            pass
    return tags


def mmcv_tags(trainer, record):
    """MMCV ``LoggerHook.get_loggable_tags`` of a record: its numbers (no position or
    timing keys), then ``learning_rate`` / ``momentum`` on train records."""
    outputs = trainer.outputs or {}
    own_log_vars = not has_train_step(trainer.model) or 'log_vars' in outputs
    tags = {key: value for key, value in record.items() if key not in _POSITION_KEYS
            and isinstance(value, (int, float)) and not isinstance(value, bool)
            and (own_log_vars or key != 'loss')}  # MMCV logs a train_step's log_vars only
    tags.update(_schedule_tags(trainer.optimizer))
    return tags


@HOOKS.register_module(force=True)
class PaviLoggerHook(LoggerHook):
    """MMCV's ``PaviLoggerHook``: ``pavi.SummaryWriter(**init_kwargs)``, one
    ``add_scalars(mode, tags, step)`` per log event; ``add_last_ckpt`` uploads the last
    checkpoint at the end with ``add_snapshot_file``. ``add_graph`` is not supported."""

    def __init__(self, init_kwargs=None, add_graph=False, add_last_ckpt=False, interval=10, ignore_last=True,
                 reset_flag=False, by_epoch=True, img_key='img_info', add_graph_kwargs=None):
        super().__init__(interval, ignore_last, by_epoch)
        if add_graph:
            raise ConfigError('PaviLoggerHook add_graph is not supported')
        self.init_kwargs, self.add_last_ckpt = dict(init_kwargs or {}), add_last_ckpt
        self.writer = None

    def open(self, trainer):
        pavi = require('pavi', type(self).__name__)
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault('name', trainer.timestamp)
        self.writer = pavi.SummaryWriter(**kwargs)

    def log(self, trainer, record):
        tags = mmcv_tags(trainer, record)
        if record['mode'] == 'val' and self.by_epoch:
            step = record['epoch']
        else:
            step = record['iter']
        if tags:
            self.writer.add_scalars(record['mode'], tags, step)

    def close(self, trainer):
        import os
        last = os.path.join(trainer.work_dir, 'latest.pth')
        if self.add_last_ckpt and os.path.exists(last):
            self.writer.add_snapshot_file(tag=os.path.basename(trainer.work_dir.rstrip(os.sep)),
                                          snapshot_file_path=os.path.realpath(last),
                                          iteration=trainer.epoch if self.by_epoch else trainer.iter)


def _unsupported(name, instead):
    def __init__(self, *args, **kwargs):
        raise ConfigError(f'{name} is not supported by hookloop; use {instead}')
    return type(name, (LoggerHook,), {'__init__': __init__, '__doc__': f'Not supported: use {instead}.'})


ClearMLLoggerHook = _unsupported('ClearMLLoggerHook', 'MlflowLoggerHook or TensorboardLoggerHook')


class MMCVTrackerHook(LoggerHook):
    """Base of the MMCV-format tracker hooks: one ``log_tags(tags, step, record)`` per log
    event with MMCV's tags, ``step`` the iteration count MMCV's ``get_iter`` gives (the
    completed iterations of a train record; one more for a validation record)."""

    def log(self, trainer, record):
        tags = mmcv_tags(trainer, record)
        if record['mode'] != 'train':
            tags = {k if k.startswith(('learning_rate', 'momentum')) else f'{record["mode"]}/{k}': v
                    for k, v in tags.items()}
        step = record['iter'] if record['mode'] == 'train' else record['iter'] + 1
        if tags:
            self.log_tags(trainer, tags, step, record)

    def log_tags(self, trainer, tags, step, record):
        raise NotImplementedError


class MlflowLoggerHook(MMCVTrackerHook):
    """MMCV's ``MlflowLoggerHook(exp_name=None, tags=None, log_model=True, ...)``:
    ``mlflow.log_metrics(tags, step=...)``; with ``log_model`` the model is logged at the end."""

    def __init__(self, exp_name=None, tags=None, log_model=True, interval=10, ignore_last=True, reset_flag=False,
                 by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        self.mlflow = require('mlflow', type(self).__name__)
        self.mlflow_pytorch = require('mlflow.pytorch', type(self).__name__, 'mlflow')
        self.exp_name, self.tags, self.log_model = exp_name, tags, log_model

    def open(self, trainer):
        if self.exp_name is not None:
            self.mlflow.set_experiment(self.exp_name)
        if self.tags is not None:
            self.mlflow.set_tags(self.tags)

    def log_tags(self, trainer, tags, step, record):
        self.mlflow.log_metrics(tags, step=step)

    def close(self, trainer):
        if self.log_model and not trainer.outcome.failed:
            self.mlflow_pytorch.log_model(trainer.model, 'models')


class WandbLoggerHook(MMCVTrackerHook):
    """MMCV's ``WandbLoggerHook(init_kwargs=None, commit=True, ...)``: ``wandb.init(**init_kwargs)``,
    ``wandb.log(tags, step=..., commit=commit)``, ``wandb.join()`` at the end."""

    def __init__(self, init_kwargs=None, interval=10, ignore_last=True, reset_flag=False, commit=True,
                 by_epoch=True, with_step=True, log_artifact=True, out_suffix=('.log.json', '.log', '.py')):
        super().__init__(interval, ignore_last, by_epoch)
        self.wandb = require('wandb', type(self).__name__)
        self.init_kwargs, self.commit, self.with_step = init_kwargs, commit, with_step

    def open(self, trainer):
        self.wandb.init(**(self.init_kwargs or {}))

    def log_tags(self, trainer, tags, step, record):
        if self.with_step:
            self.wandb.log(tags, step=step, commit=self.commit)
        else:
            self.wandb.log({**tags, 'global_step': step}, commit=self.commit)

    def close(self, trainer):
        self.wandb.join()


class NeptuneLoggerHook(MMCVTrackerHook):
    """MMCV's ``NeptuneLoggerHook(init_kwargs=None, ...)``: ``neptune.new.init(**init_kwargs)``,
    ``run[tag].log(value, step=...)``, ``run.stop()`` at the end."""

    def __init__(self, init_kwargs=None, interval=10, ignore_last=True, reset_flag=True, with_step=True,
                 by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        self.neptune = require('neptune.new', type(self).__name__, 'neptune-client')
        self.init_kwargs, self.with_step, self.run = init_kwargs, with_step, None

    def open(self, trainer):
        self.run = self.neptune.init(**(self.init_kwargs or {}))

    def log_tags(self, trainer, tags, step, record):
        for name, value in tags.items():
            if self.with_step:
                self.run[name].log(value, step=step)
            else:
                self.run[name].log(value)

    def close(self, trainer):
        self.run.stop()


class DvcliveLoggerHook(MMCVTrackerHook):
    """MMCV's ``DvcliveLoggerHook(model_file=None, ...)``: ``dvclive.Live(**kwargs)``,
    ``set_step(step)`` then ``log(name, value)`` per tag; ``model_file``: the weights are
    saved there at the end."""

    def __init__(self, model_file=None, interval=10, ignore_last=True, reset_flag=False, by_epoch=True, **kwargs):
        super().__init__(interval, ignore_last, by_epoch)
        live = require('dvclive', type(self).__name__)
        self.dvclive = live.Live(**kwargs)
        self.model_file = model_file

    def log_tags(self, trainer, tags, step, record):
        self.dvclive.set_step(step)
        for name, value in tags.items():
            self.dvclive.log(name, value)

    def close(self, trainer):
        if self.model_file is not None and not trainer.outcome.failed:
            from . import save_checkpoint
            save_checkpoint(trainer.model, self.model_file)


class SegmindLoggerHook(MMCVTrackerHook):
    """MMCV's ``SegmindLoggerHook``: ``segmind``'s ``try_mlflow_log(log_metrics, tags,
    step=epoch, epoch=epoch)``."""

    def __init__(self, interval=10, ignore_last=True, reset_flag=False, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        segmind = require('segmind', type(self).__name__)
        self.segmind_log_metrics = segmind.tracking.fluent.log_metrics
        self.segmind_mlflow_log = segmind.utils.logging_utils.try_mlflow_log

    def log_tags(self, trainer, tags, step, record):
        epoch = record['epoch'] if record['mode'] != 'train' else trainer.epoch
        self.segmind_mlflow_log(self.segmind_log_metrics, tags, step=epoch, epoch=epoch)


@HOOKS.register_module(force=True)
class SyncBuffersHook(Hook):
    """MMCV's ``SyncBuffersHook(distributed=True)``: after each epoch the model's buffers
    (BatchNorm statistics) are averaged across ranks (nothing to do in one process)."""

    def __init__(self, distributed=True):
        self.distributed = distributed

    def after_epoch(self, trainer):
        import torch.distributed as dist
        if self.distributed and trainer.world_size > 1:
            buffers = list(trainer.model.buffers())
            for buffer in buffers:
                if buffer.is_floating_point():
                    dist.all_reduce(buffer.data.div_(trainer.world_size))
