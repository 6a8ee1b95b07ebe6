"""ModelScope's ``trainer.log_buffer`` (its ``LogBuffer``) over the trainer's meters, for the
trainer of a run built from a ModelScope configuration
(:class:`~hookloop.compat.modelscope_trainer.ModelScopeTrainer`).

* ``val_history`` — ``{key: [value, ...]}``: every value the meters received since the buffer
  was last cleared (the trainer clears it as each training epoch starts, where ModelScope's
  logger hook clears it): the loss of each iteration, ``iter_time`` and ``data_load_time``
  (``IterTimerHook``'s ``time`` and ``data_time``, under ModelScope's names), what the model's
  ``log_vars`` and :meth:`update` added. ``n_history`` holds a count of 1 for each value.
* ``output`` — a dict ModelScope hooks write into and read: ``lr`` is always the first param
  group's current LR (what ModelScope's ``LrSchedulerHook`` keeps there), the rest is what
  :meth:`average` computed and what code wrote.
* ``update(vars, count=1)`` adds one value per key to the meters (the loggers log them too;
  ``count`` is not kept: hookloop's logged averages are per iteration), ``average(n=0)`` puts
  the mean of the last ``n`` values (all: 0) of each key in ``output`` and sets ``ready``,
  ``clear()`` forgets the history and ``output``, ``clear_output()`` ``output`` only.
"""
from collections import OrderedDict

from .modelscope_hooks import RECORD_KEYS

_METER_NAMES = {modelscope: hookloop for hookloop, modelscope in RECORD_KEYS.items()}


class ModelScopeLogBuffer:
    """See the module docstring. ``trainer``: a weak proxy of the trainer that owns the buffer."""

    def __init__(self, trainer):
        self._trainer = trainer
        self._since = None  # the meters' mark at the last clear (None: from the start)
        self._output = OrderedDict()
        self.ready = False

    @property
    def val_history(self):
        values = self._trainer.meters.values(self._since)
        return OrderedDict((RECORD_KEYS.get(key, key), history) for key, history in values.items())

    @property
    def n_history(self):
        return OrderedDict((key, [1] * len(history)) for key, history in self.val_history.items())

    @property
    def output(self):
        if self._trainer.optimizer is not None:
            current = self._trainer.current_lr()
            self._output['lr'] = current[0] if isinstance(current, list) else \
                {name: lrs[0] for name, lrs in current.items()}
        return self._output

    def update(self, vars, count=1):  # noqa: A002 (ModelScope's argument name)
        if not isinstance(vars, dict):
            raise TypeError(f'log_buffer.update takes a dict, got {type(vars).__name__}')
        self._trainer.meters.update_dict({_METER_NAMES.get(key, key): value for key, value in vars.items()})

    def average(self, n=0):
        for key, history in self.val_history.items():
            window = history[-n:] if n > 0 else history
            self._output[key] = sum(window) / len(window)
        self.ready = True

    def clear(self):
        self._since = self._trainer.meters.mark()
        self.clear_output()

    def clear_output(self):
        self._output.clear()
        self.ready = False


__all__ = ['ModelScopeLogBuffer']
