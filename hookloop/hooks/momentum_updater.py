"""Momentum schedules with warm-up, equal to MMCV 1.x's MomentumUpdaterHook family.

The momentum of a parameter group is SGD's ``momentum`` or the first of Adam-family
``betas`` (the second is kept). Configure with ``momentum_config=dict(policy='Cyclic', ...)``.
Warm-up *divides* the regular momentum by the warm-up factor, so it starts higher
(``regular / warmup_ratio``) and comes down to the regular value.
"""
import numbers

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .. import schedules
from .param_schedule import (ParamScheduleHook, check_anneal, check_min_value, check_number, check_step,
                             check_target_ratio, per_group)


def group_momentum(group):
    if 'momentum' in group:
        return group['momentum']
    return group['betas'][0]


class MomentumUpdaterHook(ParamScheduleHook):
    """Base of the momentum policies (arguments as the LR updaters; ``warmup_ratio`` 0.9).

    The base momentum of a group is its ``initial_momentum`` (set from the current
    momentum / beta1 when absent).
    """

    PRIORITY = Priority.HIGH
    ROLE = 'momentum'
    WARMUP_RATIO = 0.9

    def __init__(self, by_epoch=True, warmup=None, warmup_iters=0, warmup_ratio=0.9, warmup_by_epoch=False):
        super().__init__(by_epoch, warmup, warmup_iters, warmup_ratio, warmup_by_epoch)

    @property
    def base_momentum(self):
        return self.base_values

    def get_momentum(self, trainer, base_momentum):
        raise NotImplementedError

    def get_value(self, trainer, base):
        return self.get_momentum(trainer, base)

    def read_base(self, trainer):
        groups = trainer.optimizer.param_groups
        for i, group in enumerate(groups):
            if 'momentum' not in group and 'betas' not in group:
                raise ConfigError(f'{type(self).__name__}: parameter group {i} of '
                                  f'{type(trainer.optimizer).__name__} has neither momentum nor betas')
            group.setdefault('initial_momentum', group_momentum(group))
        return [group['initial_momentum'] for group in groups]

    def write(self, groups, values):
        for group, momentum in zip(groups, values):
            if 'momentum' in group:
                group['momentum'] = momentum
            else:
                group['betas'] = (momentum, group['betas'][1])

    def warmup_values(self, cur_iter, regular):
        factor = schedules.warmup_factor(self.warmup, cur_iter, self.warmup_total, self.warmup_ratio)
        return [momentum / factor for momentum in regular]


@HOOKS.register_module()
class StepMomentumUpdaterHook(MomentumUpdaterHook):
    """``base * gamma ** k`` (k = steps reached), at least ``min_momentum``."""

    def __init__(self, step, gamma=0.5, min_momentum=None, **kwargs):
        owner = type(self).__name__
        self.step = check_step(owner, step)
        self.gamma = check_number(owner, 'gamma', gamma)
        self.min_momentum = None if min_momentum is None else check_number(owner, 'min_momentum', min_momentum)
        super().__init__(**kwargs)

    def get_momentum(self, trainer, base_momentum):
        return schedules.step_value(base_momentum, self.progress(trainer)[0], self.step, self.gamma,
                                    self.min_momentum)


@HOOKS.register_module()
class CosineAnnealingMomentumUpdaterHook(MomentumUpdaterHook):
    """Cosine from the base momentum to ``min_momentum`` / ``base * min_momentum_ratio``."""

    def __init__(self, min_momentum=None, min_momentum_ratio=None, **kwargs):
        check_min_value(type(self).__name__, 'momentum', min_momentum, min_momentum_ratio)
        self.min_momentum, self.min_momentum_ratio = min_momentum, min_momentum_ratio
        super().__init__(**kwargs)

    def get_momentum(self, trainer, base_momentum):
        progress, max_progress = self.progress(trainer)
        target = base_momentum * self.min_momentum_ratio if self.min_momentum_ratio is not None \
            else self.min_momentum
        return schedules.cosine_value(base_momentum, progress, max_progress, target)


@HOOKS.register_module()
class LinearAnnealingMomentumUpdaterHook(MomentumUpdaterHook):
    """A straight line from the base momentum to ``min_momentum`` / ``base * min_momentum_ratio``."""

    def __init__(self, min_momentum=None, min_momentum_ratio=None, **kwargs):
        check_min_value(type(self).__name__, 'momentum', min_momentum, min_momentum_ratio)
        self.min_momentum, self.min_momentum_ratio = min_momentum, min_momentum_ratio
        super().__init__(**kwargs)

    def get_momentum(self, trainer, base_momentum):
        progress, max_progress = self.progress(trainer)
        target = base_momentum * self.min_momentum_ratio if self.min_momentum_ratio is not None \
            else self.min_momentum
        return schedules.linear_annealing_value(base_momentum, progress, max_progress, target)


@HOOKS.register_module()
class CyclicMomentumUpdaterHook(MomentumUpdaterHook):
    """The momentum mirror of ``CyclicLrUpdaterHook`` (per iteration only): down to
    ``base * target_ratio[0]`` while the learning rate rises, then to ``base * target_ratio[1]``."""

    BY_ITER_ONLY = True

    def __init__(self, by_epoch=False, target_ratio=(0.85 / 0.95, 1), cyclic_times=1, step_ratio_up=0.4,
                 anneal_strategy='cos', gamma=1, **kwargs):
        owner = type(self).__name__
        self.target_ratio = check_target_ratio(owner, target_ratio)
        self.cyclic_times = check_number(owner, 'cyclic_times', cyclic_times, low=0, low_open=True, integer=True)
        self.step_ratio_up = check_number(owner, 'step_ratio_up', step_ratio_up, low=0, high=1, high_open=True)
        self.anneal_strategy = check_anneal(owner, anneal_strategy)
        self.gamma = check_number(owner, 'gamma', gamma, low=0, high=1, low_open=True)
        super().__init__(by_epoch=by_epoch, **kwargs)

    def prepare(self, trainer):
        if trainer.max_iters // self.cyclic_times < 1:
            raise ConfigError(f'{type(self).__name__}: cyclic_times={self.cyclic_times} is more than the '
                              f'{trainer.max_iters} iterations of the run')

    def get_momentum(self, trainer, base_momentum):
        return schedules.cyclic_value(base_momentum, trainer.iter, trainer.max_iters, self.target_ratio,
                                      self.cyclic_times, self.step_ratio_up, self.anneal_strategy, self.gamma)


@HOOKS.register_module()
class OneCycleMomentumUpdaterHook(MomentumUpdaterHook):
    """The momentum of the 1cycle policy (per iteration only): from ``max_momentum`` down to
    ``base_momentum`` by ``pct_start`` of ``max_iters``, then back up. Both are a number or a
    list (one per parameter group); the optimizer's own momentum is not used. The cycle is
    always ``max_iters`` long (MMCV ignores the LR hook's ``total_steps`` here)."""

    BY_ITER_ONLY = True

    def __init__(self, base_momentum=0.85, max_momentum=0.95, pct_start=0.3, anneal_strategy='cos',
                 three_phase=False, by_epoch=False, **kwargs):
        owner = type(self).__name__
        for name, value in (('base_momentum', base_momentum), ('max_momentum', max_momentum)):
            if isinstance(value, bool) or not isinstance(value, (numbers.Real, list, tuple)):
                raise ConfigError(f'{owner}: {name} must be a number or a list (one per parameter group), '
                                  f'got {value!r}')
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ConfigError(f'{owner}: pct_start must be a float in [0, 1], got {pct_start!r}')
        self._base_momentum, self._max_momentum = base_momentum, max_momentum
        self.pct_start = pct_start
        self.anneal_strategy = check_anneal(owner, anneal_strategy)
        self.three_phase = bool(three_phase)
        self.cycle = []  # (base, max) per parameter group
        super().__init__(by_epoch=by_epoch, **kwargs)

    def read_base(self, trainer):
        # As MMCV: the momentum starts at max_momentum and both bounds live in the group.
        owner = type(self).__name__
        groups = trainer.optimizer.param_groups
        lows = per_group(owner, 'base_momentum', self._base_momentum, groups)
        highs = per_group(owner, 'max_momentum', self._max_momentum, groups)
        for i, (group, low, high) in enumerate(zip(groups, lows, highs)):
            if 'momentum' not in group and 'betas' not in group:
                raise ConfigError(f'{owner}: parameter group {i} of {type(trainer.optimizer).__name__} has '
                                  'neither momentum nor betas')
            self.write([group], [high])
            group['base_momentum'], group['max_momentum'] = low, high
        self.cycle = list(zip(lows, highs))
        return highs

    def after_load_checkpoint(self, trainer, checkpoint):
        pass  # the bounds come from the config, as in before_run

    def prepare(self, trainer):
        ends = schedules.one_cycle_phases(trainer.max_iters, self.pct_start, self.three_phase)
        starts = [0] + ends[:-1]
        if any(end == start for start, end in zip(starts, ends)):
            raise ConfigError(f'{type(self).__name__}: pct_start={self.pct_start} with {trainer.max_iters} '
                              f'iterations leaves a phase without iterations (phase ends {ends})')

    def regular(self, trainer):
        return [schedules.one_cycle_momentum(trainer.iter, trainer.max_iters, low, high, self.pct_start,
                                             self.three_phase, self.anneal_strategy)
                for low, high in self.cycle]


__all__ = ['MomentumUpdaterHook', 'StepMomentumUpdaterHook', 'CosineAnnealingMomentumUpdaterHook',
           'LinearAnnealingMomentumUpdaterHook', 'CyclicMomentumUpdaterHook', 'OneCycleMomentumUpdaterHook',
           'group_momentum']
