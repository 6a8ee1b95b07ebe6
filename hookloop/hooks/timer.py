"""IterTimerHook: wall time per iteration and time spent waiting for data."""
import time

from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Records ``time`` (seconds per training iteration) and ``data_time`` (of which waiting
    for the batch, from ``trainer.step.data_seconds``) in the meters, as host floats: no
    device sync, and no call at an iteration without a meter read.

    The meters ask for the values when they are read (a meter source, see
    :mod:`hookloop.logging.meters`): each iteration since the previous read gets the mean of that
    stretch, so a logger's average over its interval is exact; ``latest`` is the mean of the
    last stretch.

    Only training is timed: a validation run inside training (per-iteration evaluation)
    is left out of ``time`` and ``data_time``, and so out of the logged ETA, wherever the
    evaluation hook runs relative to this one. Everything else is in: data, step, hooks and
    checkpoint saves. As in MMCV, an iteration's time ends at this hook's place in
    ``after_train_iter`` (LOW: after the checkpoint hook's saves, NORMAL, before the loggers,
    VERY_LOW, which all read the same value): a read earlier in the iteration (the invalid-loss
    guard reads the meters before a save) hands the iteration over for now; the save's
    ``before_save_checkpoint`` stage makes the trainer ask this hook's ``next_call`` again, which
    then names this iteration, and its ``after_train_iter`` measures the iteration again, up to
    its place. So a window's time holds the saves made in its iterations, the run's last one
    too, and an iteration without a save costs no call. What comes after (the loggers
    themselves, an epoch-end save) goes to the next iterations, across epoch ends.

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
        self._open = None       # (iteration, count, start, data, paused): handed over before this hook's place in it

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

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        return start if self._open is not None and self._open[0] >= start else NEVER

    def before_save_checkpoint(self, trainer, checkpoint):
        """A save: after this stage the trainer asks :meth:`next_call` again (docs/hooks.md), so
        an iteration handed over before the save is measured again at this hook's place."""

    def after_train_iter(self, trainer):
        """This hook's place in the iteration: an iteration handed over earlier in it is measured
        again, up to now (MMCV's ``IterTimerHook.after_iter``)."""
        if self._open is not None and self._open[0] == trainer.iter:
            self._measure(again=True)
        self._open = None

    def _hand_over(self):
        """Give the meters one ``time`` and ``data_time`` per iteration completed since the last call."""
        if self._start is not None and _completed(self._trainer) > self._done:
            self._measure(again=False)

    def _measure(self, again):
        trainer = self._trainer
        done, position = _completed(trainer), trainer.position
        now = self._clock()
        paused = self._paused
        if self._val_start is not None:  # read during a validation: count it up to now, go on from now
            paused += now - self._val_start
            self._val_start = now
        if again:  # the stretch handed over earlier in this iteration, up to now
            _, count, begin, data, paused_before = self._open
        else:
            count, begin, data, paused_before = done - self._done, self._start, self._data, 0.0
        paused += paused_before
        meters, kept = trainer.meters, min(count, trainer.meters.history)
        data_time, seconds = [(trainer.step.data_seconds - data) / count] * kept, [(now - begin - paused) / count] * kept
        if again:
            meters.revise('data_time', data_time)
            meters.revise('time', seconds)
        else:
            meters.extend('data_time', data_time, count)
            meters.extend('time', seconds, count)
        self._open = (position.iter, count, begin, data, paused) if position.in_train_iteration and not again \
            else None
        self._restart(now, done)


def _completed(trainer):
    """Training iterations completed, also while ``after_train_iter`` runs."""
    return trainer.position.resume_point()[1]
