"""EvaluationHook: runs the validation loop on an interval."""
from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


@HOOKS.register_module()
class EvaluationHook(Hook):
    """Calls ``trainer.val()`` every ``interval`` epochs (``by_epoch``) or iterations, and
    after the last one. The results are in ``trainer.metrics`` for the hooks after it
    (a CheckpointHook with ``save_best`` reads them there).

    Args:
        interval: how often to evaluate.
        by_epoch: count ``interval`` in epochs (True) or iterations.
        start: evaluate only from this epoch / iteration count on.
    """

    PRIORITY = Priority.LOW
    ROLE = 'evaluation'

    def __init__(self, interval=1, by_epoch=True, start=None):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'EvaluationHook interval must be a positive int, got {interval!r}')
        self.interval, self.by_epoch, self.start = interval, by_epoch, start

    def _due(self, completed, is_last):
        if self.start is not None and completed < self.start:
            return False
        return completed % self.interval == 0 or is_last

    def after_train_epoch(self, trainer):
        if self.by_epoch and self._due(trainer.epoch + 1, self.is_last_epoch(trainer)):
            trainer.val()

    def after_train_iter(self, trainer):
        if not self.by_epoch and self._due(trainer.iter + 1, self.is_last_iter(trainer)):
            trainer.val()
