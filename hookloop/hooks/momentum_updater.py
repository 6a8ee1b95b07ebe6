"""Momentum schedules with warm-up, equal to MMCV 1.x's MomentumUpdaterHook family.

The momentum of a parameter group is SGD's ``momentum`` or the first of Adam-family
``betas`` (the second is kept). Configure with ``momentum_config=dict(policy='Cyclic', ...)``.
Warm-up *divides* the regular momentum by the warm-up factor, so it starts higher
(``regular / warmup_ratio``) and comes down to the regular value.
"""
from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from ..optim import param_groups, schedules
from .param_schedule import (CosineAnnealingPolicy, CyclicPolicy, LinearAnnealingPolicy, OneCyclePolicy,
                             ParamScheduleHook, StepPolicy, check_number_or_list, per_group)


group_momentum = param_groups.momentum_of


class MomentumUpdaterHook(ParamScheduleHook):
    """Base of the momentum policies (arguments as the LR updaters; ``warmup_ratio`` 0.9).

    The base momentum of a group is its ``initial_momentum`` (set from the current
    momentum / beta1 when absent).
    """

    PRIORITY = Priority.HIGH
    ROLE = 'momentum'
    RUNS_BEFORE = ('optimizer',)
    VALUE_NAME = 'momentum'
    WARMUP_RATIO = 0.9

    def __init__(self, by_epoch=True, warmup=None, warmup_iters=0, warmup_ratio=0.9, warmup_by_epoch=False):
        super().__init__(by_epoch, warmup, warmup_iters, warmup_ratio, warmup_by_epoch)

    # MMCV's extension points, called as MMCV 1.x calls them (see LrUpdaterHook):
    # ``get_regular_momentum(trainer)`` -> ``get_momentum(trainer, base_momentum)`` per group,
    # ``get_warmup_momentum(cur_iters)`` reading ``regular_mom`` and ``warmup_iters``.
    NEXT_CALL_COVERS = ('get_momentum', 'get_regular_momentum', 'get_warmup_momentum', 'get_value', 'value')

    @property
    def base_momentum(self):
        return self.base_values

    @base_momentum.setter
    def base_momentum(self, value):
        self.base_values = value

    @property
    def regular_mom(self):
        return self.regular_values

    @regular_mom.setter
    def regular_mom(self, value):
        self.regular_values = value

    def get_momentum(self, trainer, base_momentum):
        return self.value(trainer, base_momentum)

    def get_value(self, trainer, base):
        return self.get_momentum(trainer, base)

    def get_regular_momentum(self, trainer):
        return [self.get_momentum(trainer, base) for base in self.base_momentum]

    def regular(self, trainer):
        return self.get_regular_momentum(trainer)

    def get_warmup_momentum(self, cur_iters):
        factor = schedules.warmup_factor(self.warmup, cur_iters, self.warmup_iters, self.warmup_ratio)
        return [momentum / factor for momentum in self.regular_mom]

    def check_groups(self, trainer):
        """Every parameter group must have a momentum or betas."""
        for i, group in enumerate(trainer.optimizer.param_groups):
            if 'momentum' not in group and 'betas' not in group:
                raise ConfigError(f'{type(self).__name__}: parameter group {i} of '
                                  f'{type(trainer.optimizer).__name__} has neither momentum nor betas')

    def read_base(self, trainer):
        self.check_groups(trainer)
        return param_groups.base_values(trainer.optimizer.param_groups, 'initial_momentum', group_momentum)

    def write(self, groups, values):
        param_groups.set_momentum(groups, values)

    def warmup_values(self, cur_iter, regular):
        return self.get_warmup_momentum(cur_iter)  # regular is self.regular_mom, which MMCV's method reads


@HOOKS.register_module()
class StepMomentumUpdaterHook(StepPolicy, MomentumUpdaterHook):
    """``base * gamma ** k`` (k = steps reached), at least ``min_momentum``."""

    def __init__(self, step, gamma=0.5, min_momentum=None, **kwargs):
        self.init_policy(step, gamma, min_momentum)
        super().__init__(**kwargs)


@HOOKS.register_module()
class CosineAnnealingMomentumUpdaterHook(CosineAnnealingPolicy, MomentumUpdaterHook):
    """Cosine from the base momentum to ``min_momentum`` / ``base * min_momentum_ratio``."""

    def __init__(self, min_momentum=None, min_momentum_ratio=None, **kwargs):
        self.init_policy(min_momentum, min_momentum_ratio)
        super().__init__(**kwargs)


@HOOKS.register_module()
class LinearAnnealingMomentumUpdaterHook(LinearAnnealingPolicy, MomentumUpdaterHook):
    """A straight line from the base momentum to ``min_momentum`` / ``base * min_momentum_ratio``."""

    def __init__(self, min_momentum=None, min_momentum_ratio=None, **kwargs):
        self.init_policy(min_momentum, min_momentum_ratio)
        super().__init__(**kwargs)


@HOOKS.register_module()
class CyclicMomentumUpdaterHook(CyclicPolicy, MomentumUpdaterHook):
    """The momentum mirror of ``CyclicLrUpdaterHook`` (per iteration only): down to
    ``base * target_ratio[0]`` while the learning rate rises, then to ``base * target_ratio[1]``."""

    def __init__(self, by_epoch=False, target_ratio=(0.85 / 0.95, 1), cyclic_times=1, step_ratio_up=0.4,
                 anneal_strategy='cos', gamma=1, **kwargs):
        self.init_policy(target_ratio, cyclic_times, step_ratio_up, anneal_strategy, gamma)
        super().__init__(by_epoch=by_epoch, **kwargs)


@HOOKS.register_module()
class OneCycleMomentumUpdaterHook(OneCyclePolicy, MomentumUpdaterHook):
    """The momentum of the 1cycle policy (per iteration only): from ``max_momentum`` down to
    ``base_momentum`` by ``pct_start`` of ``max_iters``, then back up. Both are a number or a
    list (one per parameter group); the optimizer's own momentum is not used. The cycle is
    always ``max_iters`` long (MMCV ignores the LR hook's ``total_steps`` here)."""

    def __init__(self, base_momentum=0.85, max_momentum=0.95, pct_start=0.3, anneal_strategy='cos',
                 three_phase=False, by_epoch=False, **kwargs):
        owner = type(self).__name__
        self._base_momentum = check_number_or_list(owner, 'base_momentum', base_momentum)
        self._max_momentum = check_number_or_list(owner, 'max_momentum', max_momentum)
        self.init_policy(pct_start, anneal_strategy, three_phase)
        self.cycle = []  # (base, max) per parameter group
        super().__init__(by_epoch=by_epoch, **kwargs)

    def read_base(self, trainer):
        # As MMCV: the momentum starts at max_momentum and both bounds live in the group.
        owner = type(self).__name__
        groups = trainer.optimizer.param_groups
        lows = per_group(owner, 'base_momentum', self._base_momentum, groups)
        highs = per_group(owner, 'max_momentum', self._max_momentum, groups)
        self.check_groups(trainer)
        self.write(groups, highs)
        param_groups.set_values(groups, 'base_momentum', lows)
        param_groups.set_values(groups, 'max_momentum', highs)
        self.cycle = list(zip(lows, highs))
        return highs

    def after_load_checkpoint(self, trainer, checkpoint):
        pass  # the bounds come from the config, as in before_run

    def prepare(self, trainer):
        self.check_phases(trainer.max_iters, 'iterations')

    def regular(self, trainer):
        return [schedules.one_cycle_momentum(trainer.iter, trainer.max_iters, low, high, self.pct_start,
                                             self.three_phase, self.anneal_strategy)
                for low, high in self.cycle]


__all__ = ['MomentumUpdaterHook', 'StepMomentumUpdaterHook', 'CosineAnnealingMomentumUpdaterHook',
           'LinearAnnealingMomentumUpdaterHook', 'CyclicMomentumUpdaterHook', 'OneCycleMomentumUpdaterHook',
           'group_momentum']
