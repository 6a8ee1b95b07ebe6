"""IterTimerHook: wall time per iteration and time spent waiting for data."""
import time

from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Records ``data_time`` (waiting for the batch) and ``time`` (the whole iteration)
    in the meters, as host floats: no device sync.

    Only training is timed: a validation run inside training (per-iteration evaluation)
    is left out of ``time`` and ``data_time``, and so out of the logged ETA, wherever the
    evaluation hook runs relative to this one.
    """

    PRIORITY = Priority.LOW
    ROLE = 'timer'

    def __init__(self):
        self._start = self._val_start = None

    def before_train_epoch(self, trainer):
        self._start = time.perf_counter()

    def before_train_iter(self, trainer):
        trainer.meters.update('data_time', time.perf_counter() - self._start)

    def after_train_iter(self, trainer):
        now = time.perf_counter()
        trainer.meters.update('time', now - self._start)
        self._start = now

    def before_val_epoch(self, trainer):
        self._val_start = time.perf_counter()

    def after_val_epoch(self, trainer):
        if self._start is not None and self._val_start is not None:  # the clock pauses for validation
            self._start += time.perf_counter() - self._val_start
        self._val_start = None
