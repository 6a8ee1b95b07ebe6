"""IterTimerHook: wall time per iteration and time spent waiting for data."""
import time

from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Records ``data_time`` (waiting for the batch) and ``time`` (the whole iteration)
    in the meters, as host floats: no device sync."""

    PRIORITY = Priority.LOW
    ROLE = 'timer'

    def before_train_epoch(self, trainer):
        self._start = time.perf_counter()

    def before_train_iter(self, trainer):
        trainer.meters.update('data_time', time.perf_counter() - self._start)

    def after_train_iter(self, trainer):
        now = time.perf_counter()
        trainer.meters.update('time', now - self._start)
        self._start = now
