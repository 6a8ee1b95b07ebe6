"""EvaluationHook: runs the validation loop on an interval."""
from ..checkpoint.best import BestCheckpoint
from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook


@HOOKS.register_module()
class EvaluationHook(Hook):
    """Calls ``trainer.val()`` every ``interval`` epochs (``by_epoch``) or iterations, and
    after the last one. The results are in ``trainer.metrics`` for the hooks after it
    (a CheckpointHook with ``save_best`` reads them there).

    Args:
        interval: how often to evaluate.
        by_epoch: count ``interval`` in epochs (True) or iterations.
        start: evaluate only from this epoch / iteration count on; as in MMCV, when a run
            begins (also a resumed one) at or past ``start``, it first evaluates once before
            training, if the count it begins at is due.
        dynamic_intervals: mmdet's ``[(milestone, interval), ...]``: from ``milestone`` epochs
            (iterations) done on, evaluate every ``interval`` (YOLOX: every epoch at the end).
        greater_keys, less_keys: MMCV's, for inferring ``rule`` from the ``save_best`` name.
        save_best, rule: as MMCV's ``EvalHook``: keep the checkpoint with the best value of
            this metric in the work dir (see ``CheckpointHook(save_best=...)``, which does
            the same and can put it in ``out_dir``).
    """

    PRIORITY = Priority.LOW
    ROLE = 'evaluation'
    RUNS_AFTER = ('optimizer',)
    RUNS_BEFORE = ('checkpoint',)  # save_best needs this round's metric

    def __init__(self, interval=1, by_epoch=True, start=None, save_best=None, rule=None, greater_keys=None,
                 less_keys=None, dynamic_intervals=None):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'EvaluationHook interval must be a positive int, got {interval!r}')
        if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
            raise ConfigError(f'EvaluationHook start must be None or an int >= 0, got {start!r}')
        self.interval, self.by_epoch, self.start = interval, by_epoch, start
        self.dynamic_intervals = _check_dynamic_intervals(dynamic_intervals)
        self.best = BestCheckpoint('EvaluationHook', save_best, rule, greater_keys, less_keys) \
            if save_best is not None else None
        self._initial = start is not None  # MMCV's initial_flag: the evaluation before training

    def interval_at(self, completed):
        """The interval in force when ``completed`` epochs (iterations) are done: the last
        ``(milestone, interval)`` of ``dynamic_intervals`` with ``milestone <= completed``."""
        interval = self.interval
        for milestone, value in self.dynamic_intervals:
            if completed >= milestone:
                interval = value
        return interval

    def _due(self, completed, is_last):
        interval = self.interval_at(completed) if self.dynamic_intervals else self.interval
        if self.start is None:
            return completed % interval == 0 or is_last
        if completed < self.start:
            return False
        return (completed - self.start) % interval == 0 or is_last  # MMCV: start, start + interval, ...

    def before_train_epoch(self, trainer):
        if not self._initial:
            return
        self._initial = False
        current = trainer.epoch if self.by_epoch else trainer.iter
        # MMCV calls its after_train_* check with the counter the run begins at.
        if current >= self.start and self._due(current + 1, False):
            trainer.val()
            self._keep_best(trainer, f'epoch_{trainer.epoch}.pth' if self.by_epoch else f'iter_{trainer.iter}.pth')

    def after_train_epoch(self, trainer):
        if self.by_epoch and self._due(trainer.epoch + 1, self.is_last_epoch(trainer)):
            trainer.val()
            self._keep_best(trainer, f'epoch_{trainer.epoch + 1}.pth')

    def evaluation_loader(self, trainer):
        """The loader this hook validates on: the trainer's ``val_dataloader`` (MMCV's
        ``EvalHook`` brings its own). ``train()`` refuses to start when it is None."""
        return trainer.val_dataloader

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        if self.by_epoch:
            return NEVER
        if self.dynamic_intervals:
            return start  # the interval changes with the count: look every iteration
        offset = self.start or 0
        completed = max(start + 1, offset)  # the first count _due may accept
        due = completed + (offset - completed) % self.interval - 1
        last = trainer.max_iters - 1
        return min(due, last) if start <= last and last + 1 >= offset else due

    def after_train_iter(self, trainer):
        if not self.by_epoch and self._due(trainer.iter + 1, self.is_last_iter(trainer)):
            trainer.val()
            self._keep_best(trainer, f'iter_{trainer.iter + 1}.pth')

    def _keep_best(self, trainer, filename):
        if self.best is not None:
            self.best.update(trainer, trainer.storage_dir, filename,
                             lambda path, on_disk: self._save_best(trainer, path, on_disk))

    def _save_best(self, trainer, path, on_disk):
        """Write the new best checkpoint (``self.best`` already holds its score and path)."""
        trainer.save_checkpoint(path, update_last=False, on_disk=on_disk)

    def run_summary(self, trainer):
        return self.best.run_summary(trainer) if self.best is not None else {}

    def state_dict(self):
        return self.best.state_dict() if self.best is not None else {}

    def load_state_dict(self, state):
        if self.best is not None:
            self.best.load_state_dict(state)


def _check_dynamic_intervals(value):
    if value is None:
        return []
    try:
        pairs = sorted((int(m), int(i)) for m, i in value)
    except (TypeError, ValueError):
        raise ConfigError(f'EvaluationHook dynamic_intervals must be a list of (milestone, interval) pairs, '
                          f'got {value!r}') from None
    if any(m < 0 or i < 1 for m, i in pairs):
        raise ConfigError(f'EvaluationHook dynamic_intervals need milestones >= 0 and intervals >= 1, got {value!r}')
    return pairs
