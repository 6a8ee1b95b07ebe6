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
    checkpoint saves. An iteration's time runs to the last read made while its
    ``after_train_iter`` runs: a read there (the invalid-loss guard reads the meters before a
    save) hands the iteration over, and a later read in it (the logger's) measures it again, so a
    window's time holds the saves made in its iterations, as MMCV's order (checkpoint NORMAL,
    timer LOW, logger VERY_LOW) gives. What comes after an iteration's last read (the logger
    itself, an epoch-end save) goes to the next iterations, across epoch ends.

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
        self._open = None       # (iteration, count, start, data, paused) of a hand-over made during that iteration

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
        """Give the meters one ``time`` and ``data_time`` per iteration completed since the last
        call; a call in the same iteration as the last one measures that hand-over again."""
        if self._start is None:
            return
        trainer = self._trainer
        done = _completed(trainer)
        count = done - self._done
        position = trainer.position
        again = count <= 0 and position.in_train_iteration and self._open is not None and \
            self._open[0] == position.iter
        if count <= 0 and not again:
            return
        now = self._clock()
        paused = self._paused
        if self._val_start is not None:  # read during a validation: count it up to now, go on from now
            paused += now - self._val_start
            self._val_start = now
        if again:  # the stretch handed over earlier in this iteration, up to now
            _, count, begin, data, paused_before = self._open
        else:
            begin, data, paused_before = self._start, self._data, 0.0
        paused += paused_before
        meters, kept = trainer.meters, min(count, trainer.meters.history)
        data_time, seconds = [(trainer.step.data_seconds - data) / count] * kept, [(now - begin - paused) / count] * kept
        if again:
            meters.revise('data_time', data_time)
            meters.revise('time', seconds)
        else:
            meters.extend('data_time', data_time, count)
            meters.extend('time', seconds, count)
        # Read while after_train_iter runs: the iteration is not over (a save may follow); a later
        # read in it (the logger's) measures this stretch again.
        self._open = (position.iter, count, begin, data, paused) if position.in_train_iteration else None
        self._restart(now, done)


def _completed(trainer):
    """Training iterations completed, also while ``after_train_iter`` runs."""
    return trainer.position.resume_point()[1]
