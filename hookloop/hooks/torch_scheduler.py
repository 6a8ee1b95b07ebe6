"""Drive a torch ``LRScheduler`` from the loop, stepped per iteration or per epoch.

``lr_config=dict(type='TorchSchedulerHook', scheduler=dict(type='CosineAnnealingLR', T_max=100),
by_epoch=False)``. The scheduler's state is part of the hook's state, so checkpoints
resume it exactly.
"""
from collections.abc import Mapping

import torch

from ..errors import ConfigError
from ..optim import param_groups
from ..priority import Priority
from ..registry import HOOKS, check_call_arguments, closest_names
from .base import NEVER, Hook


def _scheduler_classes():
    module = torch.optim.lr_scheduler
    base = module.LRScheduler
    return {name: obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, base) and obj is not base}


@HOOKS.register_module(module_name=['TorchSchedulerHook', 'TorchScheduler', 'TorchSchedulerLrUpdaterHook'])
class TorchSchedulerHook(Hook):
    """Steps a ``torch.optim.lr_scheduler.LRScheduler``.

    Args:
        scheduler: one of
            * a dict ``dict(type='StepLR', step_size=3, ...)`` naming a class of
              ``torch.optim.lr_scheduler`` (or giving the class), built on the trainer's optimizer;
            * a callable ``optimizer -> scheduler``;
            * a scheduler already built on the trainer's optimizer.
        by_epoch: step once per epoch (as ``scheduler.step()`` after each epoch of a plain
            loop); ``False``: once per iteration.

    The step that a plain loop makes after iteration (epoch) ``k`` is made before
    iteration (epoch) ``k + 1`` starts, so the optimizer has stepped first and the
    learning rate each iteration uses is the same. ``ReduceLROnPlateau`` needs a metric
    and is not accepted.
    """

    PRIORITY = Priority.VERY_HIGH
    ROLE = 'lr'
    RUNS_BEFORE = ('optimizer',)

    def __init__(self, scheduler, by_epoch=True):
        owner = type(self).__name__
        if not isinstance(by_epoch, bool):
            raise ConfigError(f'{owner}: by_epoch must be True or False, got {by_epoch!r}')
        if isinstance(scheduler, Mapping):
            cfg = dict(scheduler)
            kind = cfg.pop('type', None)
            classes = _scheduler_classes()
            if isinstance(kind, str):
                if kind not in classes:
                    hint = closest_names(kind, classes)
                    raise ConfigError(f'{owner}: unknown scheduler type {kind!r}'
                                      f'{"; closest: " + ", ".join(hint) if hint else ""}; '
                                      f'known: {", ".join(sorted(classes))}')
                kind = classes[kind]
            if not (isinstance(kind, type) and issubclass(kind, torch.optim.lr_scheduler.LRScheduler)):
                raise ConfigError(f'{owner}: scheduler "type" must name a torch LRScheduler, got {kind!r}')
            check_call_arguments(kind, dict(cfg, optimizer=None), what=kind.__name__)
            self._build = lambda optimizer: kind(optimizer, **cfg)
        elif isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
            self._build = None
        elif callable(scheduler) and not isinstance(scheduler, type):
            self._build = scheduler
        else:
            raise ConfigError(f'{owner}: scheduler must be a torch LRScheduler, a dict(type=...) or a function '
                              f'optimizer -> scheduler; got {scheduler!r} (ReduceLROnPlateau is not supported)')
        self.scheduler = scheduler if self._build is None else None
        self.by_epoch = by_epoch
        self._pending = None  # a checkpoint's scheduler state, loaded before the scheduler is built

    def before_run(self, trainer):
        if self._build is not None and self.scheduler is None:
            # Building steps the scheduler once, which rewrites the groups' lr; a resumed run
            # (restored before before_run) keeps the checkpoint's values and the saved state.
            lrs = [group['lr'] for group in trainer.optimizer.param_groups]
            self.scheduler = param_groups.build_scheduler(self._build, trainer.optimizer)
            if not isinstance(self.scheduler, torch.optim.lr_scheduler.LRScheduler):
                raise ConfigError(f'{type(self).__name__}: the scheduler function returned '
                                  f'{type(self.scheduler).__name__}, not a torch LRScheduler')
            if self._pending is not None:
                self.scheduler.load_state_dict(self._pending)
                self._pending = None
                param_groups.set_lr(trainer.optimizer.param_groups, lrs)
        if self.scheduler.optimizer is not trainer.optimizer:
            raise ConfigError(f'{type(self).__name__}: the scheduler was built on another optimizer than the '
                              "trainer's; pass a dict or a function optimizer -> scheduler instead")

    def _catch_up(self, done):
        # ``last_epoch`` counts the steps made; step until it matches the units completed.
        while self.scheduler.last_epoch < done:
            param_groups.step_scheduler(self.scheduler)

    def before_train_epoch(self, trainer):
        if self.by_epoch:
            self._catch_up(trainer.epoch)

    def next_call(self, trainer, stage, start):
        if stage != 'before_train_iter':
            return None  # a stage this schedule was not written for
        return None if not self.by_epoch else NEVER

    def before_train_iter(self, trainer):
        if not self.by_epoch:
            self._catch_up(trainer.iter)

    def state_dict(self):
        return {'scheduler': self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state):
        if state.get('scheduler') is None:
            return
        if self.scheduler is None:  # built from a dict or a function in before_run: loaded there
            self._pending = state['scheduler']
        else:
            self.scheduler.load_state_dict(state['scheduler'])


__all__ = ['TorchSchedulerHook']
