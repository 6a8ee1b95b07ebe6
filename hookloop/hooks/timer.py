"""IterTimerHook: wall time per iteration and time spent waiting for data."""
import time

from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Records ``time`` (seconds per training iteration) and ``data_time`` (of which waiting
    for the batch, from ``trainer.step.data_seconds``) in the meters, as host floats: no
    device sync, and no call at each iteration.

    The meters ask for the values when they are read (a meter source, see
    :mod:`hookloop.logging.meters`): each iteration since the previous read gets the mean of that
    stretch, so a logger's average over its interval is exact; ``latest`` is the mean of the
    last stretch.

    Only training is timed: a validation run inside training (per-iteration evaluation)
    is left out of ``time`` and ``data_time``, and so out of the logged ETA, wherever the
    evaluation hook runs relative to this one. Everything else is in: data, step, hooks and
    checkpoint saves, also those after a read in the middle of an iteration (the invalid-loss
    guard reads the meters before a save): the time after a read goes to the next iterations,
    across epoch ends, never dropped.

    Args:
        clock: a zero-argument function returning seconds (default ``time.perf_counter``);
            tests inject a fake one.
    """

    PRIORITY = Priority.LOW
    ROLE = 'timer'

    def __init__(self, clock=None):
        self._clock = clock or time.perf_counter
        self._trainer = self._start = self._val_start = None
        self._done = 0          # training iterations completed at the last hand-over
        self._data = 0.0        # trainer.step.data_seconds then
        self._paused = 0.0      # validation seconds since then

    def before_run(self, trainer):
        self._trainer = trainer
        trainer.meters.add_source(self._hand_over)

    def before_train_epoch(self, trainer):
        self._hand_over()  # the previous epoch's tail, before a logger marks the new epoch
        if self._start is None:  # a run's first epoch; later ones go on counting (epoch-end saves)
            self._restart(self._clock())

    def before_val_epoch(self, trainer):
        self._val_start = self._clock()

    def after_val_epoch(self, trainer):
        if self._val_start is not None:  # the clock pauses for validation
            self._paused += self._clock() - self._val_start
        self._val_start = None

    def after_run(self, trainer):
        self._hand_over()
        trainer.meters.remove_source(self._hand_over)
        self._start = self._trainer = None  # (no cycle left through the trainer: a dropped one is freed at once)

    def _restart(self, now, done=None):
        trainer = self._trainer
        done = _completed(trainer) if done is None else done
        self._start, self._done, self._data, self._paused = now, done, trainer.step.data_seconds, 0.0

    def _hand_over(self):
        """Give the meters one ``time`` and ``data_time`` per iteration completed since the last call."""
        if self._start is None:
            return
        trainer = self._trainer
        done = _completed(trainer)
        count = done - self._done
        if count <= 0:
            return
        now = self._clock()
        paused = self._paused
        if self._val_start is not None:  # read during a validation: count it up to now, go on from now
            paused += now - self._val_start
            self._val_start = now
        kept = min(count, trainer.meters.history)
        trainer.meters.extend('data_time', [(trainer.step.data_seconds - self._data) / count] * kept, count)
        trainer.meters.extend('time', [(now - self._start - paused) / count] * kept, count)
        self._restart(now, done)


def _completed(trainer):
    """Training iterations completed, also while ``after_train_iter`` runs."""
    return trainer.position.resume_point()[1]
