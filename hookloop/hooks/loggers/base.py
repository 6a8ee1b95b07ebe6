"""LoggerHook: when to log and what one log event holds; subclasses say where it goes.

Every logger hook reads the shared :class:`~hookloop.logging.meters.MeterBuffer`
(``trainer.meters``) and averages over its own interval. All ranks compute the
summary (it may all-reduce across ranks); only rank 0 writes.
"""

import torch

from ...errors import ConfigError
from ...fileio.paths import ensure_writable_dir
from ...logging.profiling import profile_record
from ...optim.param_groups import momentum_of
from ...priority import Priority
from ..base import Hook


def flatten(value, prefix=''):
    """``{'a': {'b': 1}, 'c': [2, 3]}`` -> ``{'a.b': 1, 'c.0': 2, 'c.1': 3}`` (for trackers' params)."""
    items = {}
    if isinstance(value, dict):
        for key, sub in value.items():
            items.update(flatten(sub, f'{prefix}{key}.'))
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (dict, list, tuple)) for v in value):
        for n, sub in enumerate(value):
            items.update(flatten(sub, f'{prefix}{n}.'))
    else:
        items[prefix[:-1]] = value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)
    return items


def check_writable_dir(path, owner):
    """Create ``path`` and prove it writable, or raise ConfigError naming ``owner``."""
    return ensure_writable_dir(path, f'{owner}: log directory')


def require(module, owner, package=None):
    """Import an optional tracker library or raise ConfigError saying how to install it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = package or module.split('.')[0]
        raise ConfigError(f'{owner} needs the {package!r} package, which cannot be imported ({exc}); '
                          f'install it with `pip install {package}` or `pip install hookloop[loggers]`') from None


def _positive_int(owner, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'{owner} {name} must be a positive int, got {value!r}')
    return value


class LoggerHook(Hook):
    """Base of the logger hooks: decides the log iterations and builds the records.

    Args:
        interval: log every ``interval`` iterations (of the epoch when ``by_epoch``).
        ignore_last: skip the last, partial interval of an epoch (MMCV's default).
        by_epoch: count ``interval`` within each epoch, or in global iterations.

    The step of a record is the number of iterations completed (MMCV: with
    ``interval=5`` the steps are 5, 10, ...); validation results carry the step of
    the training iterations completed when they were computed, and a validation run
    from inside a training iteration is logged after that iteration's train record.

    With ``by_epoch`` the averaging window restarts with every epoch (MMCV clears its log
    buffer there): the ignored tail of one epoch is not averaged into the next one.

    Subclasses implement ``open(trainer)`` (rank 0, before training), ``log(trainer,
    record)`` and ``close(trainer)`` (rank 0, on every exit path). A ``record`` is a dict
    with ``mode`` ('train' or 'val'), ``epoch`` (1-based), ``iter`` (the step), for
    'train' ``inner_iter`` when ``by_epoch``, then the metrics as floats.

    Images come through :func:`hookloop.logging.images.publish_images`, which asks
    ``accepts_images(trainer)`` and calls ``log_images(trainer, tag, images, step)``
    (``images``: a list of ``(H, W, 3)`` uint8 arrays) of the loggers that accept them: a
    subclass with an image API implements ``log_images``.
    """

    PRIORITY = Priority.VERY_LOW
    ROLE = 'logger'
    RUNS_AFTER = ('*',)  # loggers see everything the other hooks produced
    # Called only at log events, which next_call names: a subclass may override them and keep the schedule.
    NEXT_CALL_COVERS = ('open', 'close', 'log', 'log_images', 'accepts_images', 'train_record',
                        'log_profile')
    _kept_failure = None  # see keep_failure

    def __init__(self, interval=10, ignore_last=True, by_epoch=True):
        self.interval = _positive_int(type(self).__name__, 'interval', interval)
        self.ignore_last = ignore_last
        self.by_epoch = by_epoch
        self._mark = None
        self._opened = False
        self._pending = []  # val records waiting for the train record of their iteration

    # -- hooks ------------------------------------------------------------------------------
    def before_run(self, trainer):
        trainer.meters.reserve(self.interval)
        self._mark = trainer.meters.mark()
        if trainer.rank == 0:
            self.open(trainer)
            self._opened = True

    def before_train_epoch(self, trainer):
        if self.by_epoch and trainer.inner_iter == 0:  # a new epoch, not a run continuing one
            self._mark = trainer.meters.mark()

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        if self.by_epoch:
            due = self.next_every_n_inner_iters(trainer, start, self.interval)
        else:
            due = self.next_every_n_iters(start, self.interval)
        if self.ignore_last:
            return due
        end = self.epoch_end_iter(trainer)
        return min(due, end) if start <= end else due

    def after_train_iter(self, trainer):
        if self.should_log(trainer):
            summary, self._mark = trainer.meters.summary_and_mark(self._mark)  # on every rank: may all-reduce
            if trainer.rank == 0:
                self.log(trainer, self.train_record(trainer, summary))
        if self._pending:
            for record in self._pending:
                self.log(trainer, record)
            self._pending = []

    def after_val_epoch(self, trainer):
        if not self._opened:  # rank != 0, or trainer.val() outside a run
            return
        _, completed, _ = trainer.position.resume_point()  # right also when run inside after_train_iter
        record = {'mode': 'val', 'epoch': trainer.epoch + 1, 'iter': completed}
        record.update({k: _number(v) for k, v in trainer.metrics.items()})
        if trainer.position.in_train_iteration and self.should_log(trainer):
            self._pending.append(record)  # MMCV order: this iteration's train record first
        else:
            self.log(trainer, record)

    def after_run(self, trainer):
        for record in self._pending:  # a run that ended inside the iteration (an error)
            self.log(trainer, record)
        self._pending = []
        if self._opened:
            profile = profile_record(trainer)  # with profile_hooks: before the destination closes
            if profile is not None:
                self.log_profile(trainer, profile)
            self._opened = False
            self.close(trainer)

    # -- what and when ----------------------------------------------------------------------
    def should_log(self, trainer):
        if self.by_epoch and self.every_n_inner_iters(trainer, self.interval):
            return True
        if not self.by_epoch and self.every_n_iters(trainer, self.interval):
            return True
        return not self.ignore_last and self.end_of_epoch(trainer)

    def train_record(self, trainer, summary):
        position = trainer.position
        record = {'mode': 'train', 'epoch': position.epoch + 1, 'iter': position.iter + 1}
        if self.by_epoch:
            record['inner_iter'] = position.inner_iter + 1
        optimizer = trainer.optimizer
        if optimizer is not None and optimizer.param_groups:  # the first group's, as MMCV's current_lr()
            group = optimizer.param_groups[0]
            record['lr'] = group['lr']
            if 'momentum' in group or 'betas' in group:
                record['momentum'] = momentum_of(group)
        for key in ('time', 'data_time'):
            if key in summary:
                record[key] = summary[key]['avg']
        if trainer.device.type == 'cuda':
            record['memory'] = round(torch.cuda.max_memory_allocated(trainer.device) / 2 ** 20)
        for key, value in summary.items():
            record.setdefault(key, value['avg'])
        return record

    @staticmethod
    def metrics_of(record):
        """The metrics of a record, without its position keys."""
        return {k: v for k, v in record.items() if k not in ('mode', 'epoch', 'iter', 'inner_iter')
                and isinstance(v, (int, float)) and not isinstance(v, bool)}

    @property
    def is_open(self):
        """True between ``open`` and ``close`` (rank 0, during a run)."""
        return self._opened

    def accepts_images(self, trainer):
        """The image channel's declaration (see :mod:`hookloop.logging.images`): open, and the
        class implements ``log_images``."""
        return self._opened and type(self).log_images is not LoggerHook.log_images

    def keep_failure(self, exc):
        """For a subclass that writes its records later (at a flush point, or at exit): keep
        ``exc`` for :meth:`raise_kept_failure`, called by the subclass's next ``log``/``close``."""
        if self._kept_failure is None:
            self._kept_failure = exc

    def raise_kept_failure(self):
        if self._kept_failure is not None:
            failure, self._kept_failure = self._kept_failure, None
            raise failure

    # -- the destination ------------------------------------------------------------------
    def open(self, trainer):
        pass

    def log_images(self, trainer, tag, images, step):
        pass

    def log_profile(self, trainer, record):
        """The hook-profiling record (:func:`hookloop.logging.profiling.profile_record`), given once
        as the run ends, before ``close``; default: not written."""

    def log(self, trainer, record):
        raise NotImplementedError

    def close(self, trainer):
        pass


def _number(value):
    """A validation metric as a JSON-able number (one sync per validation, not per iteration)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value
