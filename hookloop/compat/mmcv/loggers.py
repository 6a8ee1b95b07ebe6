"""MMCV 1.7's logger hooks as MMCV calls their libraries: ``PaviLoggerHook``,
``MlflowLoggerHook``, ``WandbLoggerHook``, ``NeptuneLoggerHook``, ``DvcliveLoggerHook``,
``SegmindLoggerHook`` and ``ClearMLLoggerHook`` (hookloop's native hooks of the same names keep
hookloop's tags and batching), and ``SyncBuffersHook``.

MMCV's loggers name the schedule values ``learning_rate`` / ``momentum`` (``/<name>`` per
optimizer of a dict) and log a train-step model's ``log_vars`` only; :func:`mmcv_tags`
builds that dict from a hookloop log record.
"""
import json
import os
import warnings

from ...engine.model_step import has_train_step
from ...errors import ConfigError
from .utils import TORCH_VERSION, scandir
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
    """MMCV 1.7's ``PaviLoggerHook(init_kwargs=None, add_graph=None, img_key=None,
    add_last_ckpt=False, interval=10, ignore_last=True, reset_flag=False, by_epoch=True,
    add_graph_kwargs=None, add_ckpt_kwargs=None)``: ``pavi.SummaryWriter(**init_kwargs)`` (its
    ``name`` the work dir's, ``model`` the model's class, ``session_text`` the runner meta's
    ``config_dict``), one ``add_scalars(mode, tags, step)`` per log event; with
    ``add_ckpt_kwargs=dict(active=True, start, interval)`` the checkpoints of those epochs
    (iterations) are uploaded with ``add_snapshot_file``, with ``add_last_ckpt`` the one
    ``latest.pth`` names at the end. Adding the model graph is not supported."""

    def __init__(self, init_kwargs=None, add_graph=None, img_key=None, add_last_ckpt=False, interval=10,
                 ignore_last=True, reset_flag=False, by_epoch=True, add_graph_kwargs=None, add_ckpt_kwargs=None):
        super().__init__(interval, ignore_last, by_epoch)
        if add_graph or (add_graph_kwargs or {}).get('active', False):
            raise ConfigError('PaviLoggerHook add_graph is not supported')
        ckpt = dict(add_ckpt_kwargs or {})
        self.add_ckpt, self.add_ckpt_start = ckpt.get('active', False), ckpt.get('start', 0)
        self.add_ckpt_interval = ckpt.get('interval', 1)
        self.init_kwargs, self.add_last_ckpt = dict(init_kwargs or {}), add_last_ckpt
        self.writer = None

    def open(self, trainer):
        pavi = require('pavi', type(self).__name__)
        self.run_name = os.path.basename(trainer.work_dir.rstrip(os.sep))
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault('name', self.run_name)
        kwargs.setdefault('model', trainer.model_name)
        config = (trainer.meta or {}).get('config_dict')
        if config is not None:
            kwargs.setdefault('session_text', json.dumps(dict(config, max_iter=trainer.max_iters), default=repr))
        self.writer = pavi.SummaryWriter(**kwargs)

    def log(self, trainer, record):
        tags = mmcv_tags(trainer, record)
        step = record['epoch'] if record['mode'] == 'val' and self.by_epoch else record['iter']
        if tags:
            self.writer.add_scalars(record['mode'], tags, step)

    def next_call(self, trainer, stage, start):
        if stage == 'after_train_iter' and self.add_ckpt and not self.by_epoch:
            return None  # the uploads have their own interval: look at every iteration
        return super().next_call(trainer, stage, start)

    def after_train_iter(self, trainer):
        super().after_train_iter(trainer)
        if not self.by_epoch and self.is_open:
            self._upload_if_due(trainer, trainer.iter + 1, 'iter')

    def after_train_epoch(self, trainer):
        if self.by_epoch and self.is_open:
            self._upload_if_due(trainer, trainer.epoch + 1, 'epoch')

    def _upload_if_due(self, trainer, step, kind):
        if self.add_ckpt and step >= self.add_ckpt_start and (step - self.add_ckpt_start) % self.add_ckpt_interval == 0:
            self._upload(trainer, os.path.join(trainer.work_dir, f'{kind}_{step}.pth'), step)

    def _upload(self, trainer, path, step):
        if os.path.islink(path):
            path = os.path.join(trainer.work_dir, os.readlink(path))
        if os.path.isfile(path):
            self.writer.add_snapshot_file(tag=self.run_name, snapshot_file_path=path, iteration=step)

    def close(self, trainer):
        if self.add_last_ckpt:
            self._upload(trainer, os.path.join(trainer.work_dir, 'latest.pth'),
                         trainer.epoch if self.by_epoch else trainer.iter)
        self.writer.close()


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
            self.mlflow_pytorch.log_model(trainer.model, 'models', pip_requirements=[f'torch=={TORCH_VERSION}'])


class WandbLoggerHook(MMCVTrackerHook):
    """MMCV's ``WandbLoggerHook(init_kwargs=None, interval=10, ignore_last=True, reset_flag=False,
    commit=True, by_epoch=True, with_step=True, log_artifact=True, out_suffix=('.log.json', '.log',
    '.py'), define_metric_cfg=None)``: ``wandb.init(**init_kwargs)``, ``wandb.define_metric(metric,
    summary=...)`` per entry of ``define_metric_cfg``, ``wandb.log(tags, step=..., commit=commit)``;
    at the end the work dir's files ending in ``out_suffix`` as an artifact, then ``wandb.join()``."""

    SUMMARIES = ('min', 'max', 'mean', 'best', 'last', 'none')

    def __init__(self, init_kwargs=None, interval=10, ignore_last=True, reset_flag=False, commit=True,
                 by_epoch=True, with_step=True, log_artifact=True, out_suffix=('.log.json', '.log', '.py'),
                 define_metric_cfg=None):
        super().__init__(interval, ignore_last, by_epoch)
        self.wandb = require('wandb', type(self).__name__)
        self.init_kwargs, self.commit, self.with_step = init_kwargs, commit, with_step
        self.log_artifact, self.out_suffix, self.define_metric_cfg = log_artifact, out_suffix, define_metric_cfg

    def open(self, trainer):
        self.wandb.init(**(self.init_kwargs or {}))
        for metric, summary in (self.define_metric_cfg or {}).items():
            if summary not in self.SUMMARIES:
                warnings.warn(f'summary should be in {self.SUMMARIES}. metric={metric}, summary={summary} will be '
                              'skipped.')
            self.wandb.define_metric(metric, summary=summary)

    def log_tags(self, trainer, tags, step, record):
        if self.with_step:
            self.wandb.log(tags, step=step, commit=self.commit)
        else:
            self.wandb.log({**tags, 'global_step': step}, commit=self.commit)

    def close(self, trainer):
        if self.log_artifact:
            artifact = self.wandb.Artifact(name='artifacts', type='model')
            for name in scandir(trainer.work_dir, self.out_suffix, True):
                artifact.add_file(os.path.join(trainer.work_dir, name))
            self.wandb.log_artifact(artifact)
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
    """MMCV's ``DvcliveLoggerHook(model_file=None, interval=10, ignore_last=True,
    reset_flag=False, by_epoch=True, dvclive=None, **kwargs)``: ``dvclive`` (a ``Live``
    object of the user's) or ``dvclive.Live(**kwargs)``; ``set_step`` (the epoch count with
    ``by_epoch``, else the iteration count) then ``log(name, value)`` per tag;
    ``model_file``: the weights are saved there at the end."""

    def __init__(self, model_file=None, interval=10, ignore_last=True, reset_flag=False, by_epoch=True,
                 dvclive=None, **kwargs):
        super().__init__(interval, ignore_last, by_epoch)
        live = require('dvclive', type(self).__name__)
        self.dvclive = dvclive if dvclive is not None else live.Live(**kwargs)
        self.model_file = model_file

    def log_tags(self, trainer, tags, step, record):
        self.dvclive.set_step(record['epoch'] if self.by_epoch else step)
        for name, value in tags.items():
            self.dvclive.log(name, value)

    def close(self, trainer):
        if self.model_file is not None and not trainer.outcome.failed:
            from .checkpoint import save_checkpoint
            save_checkpoint(trainer.model, self.model_file)


class SegmindLoggerHook(MMCVTrackerHook):
    """MMCV's ``SegmindLoggerHook``: ``segmind``'s ``try_mlflow_log(log_metrics, tags,
    step=epoch, epoch=epoch)`` (the hook's ``mlflow_log`` and ``log_metrics``)."""

    def __init__(self, interval=10, ignore_last=True, reset_flag=False, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        segmind = require('segmind', type(self).__name__)
        self.log_metrics = segmind.tracking.fluent.log_metrics
        self.mlflow_log = segmind.utils.logging_utils.try_mlflow_log

    def log_tags(self, trainer, tags, step, record):
        epoch = record['epoch'] if record['mode'] != 'train' else trainer.epoch
        self.mlflow_log(self.log_metrics, tags, step=epoch, epoch=epoch)


class ClearMLLoggerHook(MMCVTrackerHook):
    """MMCV's ``ClearMLLoggerHook(init_kwargs=None, interval=10, ignore_last=True,
    reset_flag=False, by_epoch=True)``: ``clearml.Task.init(**init_kwargs)``, its logger's
    ``report_scalar(tag, tag, value, step)`` per tag."""

    def __init__(self, init_kwargs=None, interval=10, ignore_last=True, reset_flag=False, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        self.clearml = require('clearml', type(self).__name__)
        self.init_kwargs = init_kwargs

    def open(self, trainer):
        self.task = self.clearml.Task.init(**(self.init_kwargs or {}))
        self.task_logger = self.task.get_logger()

    def log_tags(self, trainer, tags, step, record):
        for tag, value in tags.items():
            self.task_logger.report_scalar(tag, tag, value, step)


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
