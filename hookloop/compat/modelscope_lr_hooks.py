"""The LR schedule of a run built from a ModelScope configuration, stepped where ModelScope's
``LrSchedulerHook`` and ``PlateauLrSchedulerHook`` step it.

ModelScope steps the scheduler at the end of an iteration (``by_epoch=False``, from iteration
``cumulative_iters - 1`` on) or of an epoch, after the optimizer step and the evaluation, and
before the loggers: what is read after ``after_train_iter`` — the optimizer's LR, the logged
``lr`` — is already the next iteration's. hookloop's :class:`~hookloop.hooks.TorchSchedulerHook`
makes the same steps just before the next iteration (epoch) starts instead; the LR each
iteration trains with is the same either way. :class:`ModelScopeLrSchedulerHook` makes them
where ModelScope does, so the LR read between iterations and the JSON log's ``lr`` are
ModelScope's. Its steps still follow the run's position (the base hook's catch-up), so a
resume from a checkpoint written before the step (the checkpoint hook runs first) makes it.

:class:`ModelScopePlateauLrSchedulerHook` steps a ``ReduceLROnPlateau`` with the metric
``metric_key`` of the evaluation that ended the epoch; an epoch without an evaluation makes no
step (ModelScope warns and skips it too).
"""
from collections.abc import Mapping

import torch

from ..errors import ConfigError
from ..hooks.base import NEVER, Hook
from ..hooks.torch_scheduler import TorchSchedulerHook
from ..priority import Priority
from ..registry import HOOKS, check_call_arguments


@HOOKS.register_module()
class ModelScopeLrSchedulerHook(TorchSchedulerHook):
    """``TorchSchedulerHook`` stepped at the end of each iteration (``by_epoch=False``) or epoch,
    after the optimizer and the evaluation, as ModelScope's ``LrSchedulerHook`` (see the module
    docstring). Arguments: :class:`~hookloop.hooks.TorchSchedulerHook`'s."""

    PRIORITY = Priority.LOW  # ModelScope's: after the checkpoint hook, before the loggers
    RUNS_AFTER = ('optimizer', 'evaluation')
    RUNS_BEFORE = ()

    def next_call(self, trainer, stage, start):
        if stage == 'before_train_iter':  # the catch-up a resume may need: every iteration when by iteration
            return None if not self.by_epoch else NEVER
        if stage == 'after_train_iter':
            return NEVER if self.by_epoch else None
        return None

    def after_train_iter(self, trainer):
        if not self.by_epoch:
            self._catch_up(trainer.iter + 1)

    def after_train_epoch(self, trainer):
        if self.by_epoch:
            self._catch_up(trainer.epoch + 1)


@HOOKS.register_module()
class ModelScopePlateauLrSchedulerHook(Hook):
    """ModelScope's ``PlateauLrSchedulerHook``: a ``ReduceLROnPlateau`` stepped after each
    evaluation that ends an epoch, with ``trainer.metrics[metric_key]``.

    Args:
        scheduler: a ``ReduceLROnPlateau`` built on the trainer's optimizer, or a dict of its
            arguments (``dict(mode='max', factor=0.1, patience=2)``; ``type`` may name it).
        metric_key: the validation metric it watches (ModelScope's ``metric_key``).
    """

    PRIORITY = Priority.LOW  # after the evaluation of the epoch (ModelScope: "should be after EvaluationHook")
    ROLE = 'lr'
    RUNS_AFTER = ('optimizer', 'evaluation')

    def __init__(self, scheduler, metric_key):
        if not isinstance(metric_key, str) or not metric_key:
            raise ConfigError(f'PlateauLrSchedulerHook metric_key must name a validation metric, got {metric_key!r}')
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        if isinstance(scheduler, Mapping):
            arguments = dict(scheduler)
            if arguments.pop('type', 'ReduceLROnPlateau') not in ('ReduceLROnPlateau', plateau):
                raise ConfigError(f'PlateauLrSchedulerHook needs a ReduceLROnPlateau scheduler, got {scheduler!r}')
            check_call_arguments(plateau, dict(arguments, optimizer=None), what='ReduceLROnPlateau')
            self._arguments, self.scheduler = arguments, None
        elif isinstance(scheduler, plateau):
            self._arguments, self.scheduler = None, scheduler
        else:
            raise ConfigError(f'PlateauLrSchedulerHook needs a ReduceLROnPlateau scheduler, got {scheduler!r}')
        self.metric_key = metric_key
        self._validations = 0  # trainer.position.validations at the last step
        self._pending = None  # a checkpoint's scheduler state, loaded once the scheduler is built

    def before_run(self, trainer):
        if self.scheduler is None:
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(trainer.optimizer, **self._arguments)
        if self.scheduler.optimizer is not trainer.optimizer:
            raise ConfigError("PlateauLrSchedulerHook: the scheduler was built on another optimizer than the "
                              "trainer's")
        if self._pending is not None:
            self.scheduler.load_state_dict(self._pending)
            self._pending = None
        self._validations = trainer.position.validations

    def after_train_epoch(self, trainer):
        if trainer.position.validations == self._validations:
            trainer.logger.warning('epoch %d has no evaluation metric values: lr_scheduler.step() skipped',
                                   trainer.epoch + 1)
            return
        self._validations = trainer.position.validations
        if self.metric_key not in trainer.metrics:
            raise ConfigError(f'PlateauLrSchedulerHook metric_key {self.metric_key!r} is not among the validation '
                              f'metrics {sorted(trainer.metrics)}')
        self.scheduler.step(float(trainer.metrics[self.metric_key]))

    def state_dict(self):
        return {'scheduler': self.scheduler.state_dict() if self.scheduler is not None else self._pending}

    def load_state_dict(self, state):
        if state.get('scheduler') is None:
            return
        if self.scheduler is None:
            self._pending = state['scheduler']
        else:
            self.scheduler.load_state_dict(state['scheduler'])


__all__ = ['ModelScopeLrSchedulerHook', 'ModelScopePlateauLrSchedulerHook']
