"""Logger hooks MMCV has and hookloop's native set does not: ``PaviLoggerHook`` (with
MMCV's tag names), and the ones refused with a pointer to a native hook.

MMCV's loggers name the schedule values ``learning_rate`` / ``momentum`` (``/<name>`` per
optimizer of a dict) and log a train-step model's ``log_vars`` only; :func:`mmcv_tags`
builds that dict from a hookloop log record.
"""
from ...errors import ConfigError
from ...hooks import LoggerHook
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
    own_log_vars = not getattr(trainer, '_model_train_step', False) or 'log_vars' in outputs
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
                                          snapshot_file_path=os.path.realpath(last), iteration=trainer.iter)


def _unsupported(name, instead):
    def __init__(self, *args, **kwargs):
        raise ConfigError(f'{name} is not supported by hookloop; use {instead}')
    return type(name, (LoggerHook,), {'__init__': __init__, '__doc__': f'Not supported: use {instead}.'})


ClearMLLoggerHook = _unsupported('ClearMLLoggerHook', 'MlflowLoggerHook or TensorboardLoggerHook')
SegmindLoggerHook = _unsupported('SegmindLoggerHook', 'MlflowLoggerHook')
