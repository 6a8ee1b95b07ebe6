"""TextLoggerHook: the terminal line and the JSON-lines log of a run."""
import datetime
import json
import os
import shutil

import torch

from ...errors import ConfigError
from ...priority import Priority
from ...registry import HOOKS
from ..base import Hook


def current_lr(optimizer):
    return optimizer.param_groups[0]['lr'] if optimizer is not None and optimizer.param_groups else None


def current_momentum(optimizer):
    if optimizer is None or not optimizer.param_groups:
        return None
    group = optimizer.param_groups[0]
    if 'momentum' in group:
        return group['momentum']
    if 'betas' in group:
        return group['betas'][0]
    return None


@HOOKS.register_module()
class TextLoggerHook(Hook):
    """Logs the meters every ``interval`` iterations to the terminal (MMCV's line:
    ``Epoch [e][i/n]  lr: ..., eta: ..., time: ..., data_time: ..., loss: ...``) and to
    ``<work_dir>/<timestamp>.log.json``, one JSON object per log event.

    Args:
        interval: log every ``interval`` iterations (of the epoch when ``by_epoch``).
        by_epoch: count iterations per epoch (``Epoch [e][i/n]``) or globally (``Iter [i/N]``).
        ignore_last: skip the last, partial interval of an epoch.
        out_dir: copy the ``.log`` and ``.log.json`` files there at the end of the run.
        out_suffix: the suffixes of the files to copy.
        interval_exp_name: also write the experiment name every this many log events.
    """

    PRIORITY = Priority.VERY_LOW
    ROLE = 'logger'

    def __init__(self, interval=10, by_epoch=True, ignore_last=True, out_dir=None,
                 out_suffix=('.log.json', '.log'), interval_exp_name=1000):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'TextLoggerHook interval must be a positive int, got {interval!r}')
        self.interval = interval
        self.by_epoch = by_epoch
        self.ignore_last = ignore_last
        self.out_dir = out_dir
        self.out_suffix = tuple([out_suffix] if isinstance(out_suffix, str) else out_suffix)
        self.interval_exp_name = interval_exp_name
        self.json_path = None
        self._start_iter = None
        self._run_start = datetime.datetime.now()

    def before_run(self, trainer):
        self._run_start = datetime.datetime.now()
        if trainer.rank != 0:
            return
        self.json_path = os.path.join(trainer.work_dir, f'{trainer.timestamp}.log.json')
        self._write_json({'hookloop': True, 'seed': trainer.seed, 'work_dir': trainer.work_dir,
                          'exp_name': os.path.basename(trainer.work_dir)})


    def _should_log(self, trainer):
        if self.by_epoch and self.every_n_inner_iters(trainer, self.interval):
            return True
        if not self.by_epoch and self.every_n_iters(trainer, self.interval):
            return True
        return not self.ignore_last and self.end_of_epoch(trainer)

    def after_train_iter(self, trainer):
        if self._start_iter is None:  # the first iteration of this process (resume-aware ETA)
            self._start_iter = trainer.iter
        if not self._should_log(trainer):
            return
        summary = trainer.meters.summary()
        trainer.meters.clear()
        if trainer.rank != 0:
            return
        record = {'mode': 'train', 'epoch': trainer.epoch + 1, 'iter': trainer.iter + 1}
        if self.by_epoch:
            record['inner_iter'] = trainer.inner_iter + 1
        lr, momentum = current_lr(trainer.optimizer), current_momentum(trainer.optimizer)
        if lr is not None:
            record['lr'] = lr
        if momentum is not None:
            record['momentum'] = momentum
        for key, value in summary.items():
            record[key] = value['avg']
        if torch.cuda.is_available() and trainer.device.type == 'cuda':
            record['memory'] = round(torch.cuda.max_memory_allocated(trainer.device) / 2 ** 20)
        trainer.logger.info(self._format_train(trainer, record))
        self._write_json(record)

    def after_val_epoch(self, trainer):
        if trainer.rank != 0:
            return
        _, completed_iters, _ = trainer.checkpoint_position()
        record = {'mode': 'val', 'epoch': trainer.epoch + 1, 'iter': completed_iters}
        record.update(trainer.metrics)
        items = ', '.join(f'{k}: {_fmt(v)}' for k, v in trainer.metrics.items())
        where = f'Epoch(val) [{trainer.epoch + 1}]' if self.by_epoch else f'Iter(val) [{completed_iters}]'
        trainer.logger.info(f'{where}  {items}')
        self._write_json(record)

    def _format_train(self, trainer, record):
        if self.by_epoch:
            head = f'Epoch [{record["epoch"]}][{record["inner_iter"]}/{trainer.epoch_length}]'
        else:
            head = f'Iter [{record["iter"]}/{trainer.max_iters}]'
        parts = []
        if 'lr' in record:
            parts.append(f'lr: {record["lr"]:.3e}')
        if 'time' in record:
            done = max(trainer.iter + 1 - (self._start_iter or 0), 1)
            elapsed = (datetime.datetime.now() - self._run_start).total_seconds()
            eta = elapsed / done * (trainer.max_iters - trainer.iter - 1)
            parts.append(f'eta: {datetime.timedelta(seconds=int(eta))}')
        skip = {'mode', 'epoch', 'iter', 'inner_iter', 'lr'}
        parts += [f'{k}: {_fmt(v)}' for k, v in record.items() if k not in skip]
        return f'{head}\t' + ', '.join(parts)

    def _write_json(self, record):
        if self.json_path is None:
            return
        with open(self.json_path, 'a', encoding='utf-8') as f:
            f.write(json.dumps(record, default=float) + '\n')

    def after_run(self, trainer):
        if trainer.rank != 0 or not self.out_dir:
            return
        target = os.path.join(self.out_dir, os.path.basename(trainer.work_dir))
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(trainer.work_dir):
            if name.endswith(self.out_suffix):
                shutil.copy2(os.path.join(trainer.work_dir, name), os.path.join(target, name))
        trainer.logger.info('copied the logs to %s', target)


def _fmt(value):
    if isinstance(value, float):
        return f'{value:.4f}' if abs(value) >= 1e-3 or value == 0 else f'{value:.3e}'
    return str(value)
