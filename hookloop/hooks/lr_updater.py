"""Learning-rate schedules with warm-up, value for value equal to MMCV 1.x's LrUpdaterHook family.

Configure with ``lr_config=dict(policy='Step', step=[8, 11], warmup='linear', warmup_iters=500)``
or ``custom_hooks=[dict(type='StepLrUpdaterHook', ...)]``. The math lives in
``hookloop.optim.schedules``; these classes check arguments and pick the progress counter. The
policies momentum has too (Step, CosineAnnealing, LinearAnnealing, Cyclic, OneCycle) keep
their checks and values in mixins in ``param_schedule``, shared with the momentum hooks.
See ``docs/schedules.md`` for every policy and MMCV's surprising corners.
"""
from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from ..optim import param_groups, schedules
from .param_schedule import (AnnealingPolicy, CosineAnnealingPolicy, CyclicPolicy, LinearAnnealingPolicy,
                             OneCyclePolicy, ParamScheduleHook, StepPolicy, check_number, check_number_or_list,
                             per_group)


class LrUpdaterHook(ParamScheduleHook):
    """Base of the learning-rate policies: sets ``param_group['lr']`` of every group.

    The base learning rate of a group is its ``initial_lr`` (set from ``lr`` when absent,
    as torch's schedulers do). Warm-up multiplies the regular learning rate by a factor
    rising to 1 (see :func:`hookloop.optim.schedules.warmup_factor`). Arguments: see
    :class:`~hookloop.hooks.param_schedule.ParamScheduleHook`.
    """

    PRIORITY = Priority.VERY_HIGH
    ROLE = 'lr'
    RUNS_BEFORE = ('optimizer',)  # the step uses this iteration's learning rate
    VALUE_NAME = 'lr'
    WARMUP_RATIO = 0.1

    def __init__(self, by_epoch=True, warmup=None, warmup_iters=0, warmup_ratio=0.1, warmup_by_epoch=False):
        super().__init__(by_epoch, warmup, warmup_iters, warmup_ratio, warmup_by_epoch)

    # MMCV's extension points, called as MMCV 1.x calls them: ``get_regular_lr(trainer)`` where
    # the regular learning rates are set (each epoch's start with ``by_epoch``, else every
    # iteration), which calls ``get_lr(trainer, base_lr)`` per group; during warm-up
    # ``get_warmup_lr(cur_iters)``, which reads ``regular_lr`` (and ``warmup_iters``, in
    # iterations). Their schedule is this hook's, so a subclass may override them and stay
    # scheduled (NEXT_CALL_COVERS).
    NEXT_CALL_COVERS = ('get_lr', 'get_regular_lr', 'get_warmup_lr', 'get_value', 'value')

    @property
    def base_lr(self):
        return self.base_values

    @base_lr.setter
    def base_lr(self, value):
        self.base_values = value

    @property
    def regular_lr(self):
        return self.regular_values

    @regular_lr.setter
    def regular_lr(self, value):
        self.regular_values = value

    def get_lr(self, trainer, base_lr):
        return self.value(trainer, base_lr)

    def get_value(self, trainer, base):
        return self.get_lr(trainer, base)

    def get_regular_lr(self, trainer):
        return [self.get_lr(trainer, base) for base in self.base_lr]

    def regular(self, trainer):
        return self.get_regular_lr(trainer)

    def get_warmup_lr(self, cur_iters):
        factor = schedules.warmup_factor(self.warmup, cur_iters, self.warmup_iters, self.warmup_ratio)
        return [lr * factor for lr in self.regular_lr]

    def read_base(self, trainer):
        return param_groups.base_values(trainer.optimizer.param_groups, 'initial_lr', lambda group: group['lr'])

    def write(self, groups, values):
        param_groups.set_lr(groups, values)

    def warmup_values(self, cur_iter, regular):
        return self.get_warmup_lr(cur_iter)  # regular is self.regular_lr, which MMCV's method reads


@HOOKS.register_module()
class FixedLrUpdaterHook(LrUpdaterHook):
    """The base learning rate throughout (useful with warm-up)."""

    def value(self, trainer, base):
        return base


@HOOKS.register_module()
class StepLrUpdaterHook(StepPolicy, LrUpdaterHook):
    """``base * gamma ** k``, k = steps reached. ``step``: an int (decay every ``step``
    epochs/iterations) or an increasing list of milestones; ``min_lr``: a floor."""

    def __init__(self, step, gamma=0.1, min_lr=None, **kwargs):
        self.init_policy(step, gamma, min_lr)
        super().__init__(**kwargs)


@HOOKS.register_module()
class ExpLrUpdaterHook(LrUpdaterHook):
    """``base * gamma ** progress``."""

    def __init__(self, gamma, **kwargs):
        self.gamma = check_number(type(self).__name__, 'gamma', gamma)
        super().__init__(**kwargs)

    def value(self, trainer, base):
        return schedules.exp_value(base, self.progress(trainer)[0], self.gamma)


@HOOKS.register_module()
class PolyLrUpdaterHook(LrUpdaterHook):
    """``(base - min_lr) * (1 - progress / max) ** power + min_lr``."""

    def __init__(self, power=1., min_lr=0., **kwargs):
        owner = type(self).__name__
        self.power = check_number(owner, 'power', power)
        self.min_lr = check_number(owner, 'min_lr', min_lr)
        super().__init__(**kwargs)

    def value(self, trainer, base):
        progress, max_progress = self.progress(trainer)
        return schedules.poly_value(base, progress, max_progress, self.power, self.min_lr)


@HOOKS.register_module()
class InvLrUpdaterHook(LrUpdaterHook):
    """``base * (1 + gamma * progress) ** -power``."""

    def __init__(self, gamma, power=1., **kwargs):
        owner = type(self).__name__
        self.gamma = check_number(owner, 'gamma', gamma)
        self.power = check_number(owner, 'power', power)
        super().__init__(**kwargs)

    def value(self, trainer, base):
        return schedules.inv_value(base, self.progress(trainer)[0], self.gamma, self.power)


@HOOKS.register_module()
class CosineAnnealingLrUpdaterHook(CosineAnnealingPolicy, LrUpdaterHook):
    """Cosine from the base learning rate to ``min_lr`` (or ``base * min_lr_ratio``; give
    exactly one) at ``progress == max`` (never reached: the last epoch/iteration is max - 1)."""

    def __init__(self, min_lr=None, min_lr_ratio=None, **kwargs):
        self.init_policy(min_lr, min_lr_ratio)
        super().__init__(**kwargs)


@HOOKS.register_module()
class FlatCosineAnnealingLrUpdaterHook(AnnealingPolicy, LrUpdaterHook):
    """Flat at the base learning rate for ``start_percent`` (a float in [0, 1]) of training,
    then cosine to ``min_lr`` / ``base * min_lr_ratio``."""

    def __init__(self, start_percent=0.75, min_lr=None, min_lr_ratio=None, **kwargs):
        owner = type(self).__name__
        if not isinstance(start_percent, float) or not 0 <= start_percent <= 1:
            raise ConfigError(f'{owner}: start_percent must be a float in [0, 1], got {start_percent!r}')
        self.start_percent = start_percent
        self.init_policy(min_lr, min_lr_ratio)
        super().__init__(**kwargs)

    def value(self, trainer, base):
        progress, max_progress = self.progress(trainer)
        return schedules.flat_cosine_value(base, progress, max_progress, self.start_percent, self.target(base))


@HOOKS.register_module()
class CosineRestartLrUpdaterHook(AnnealingPolicy, LrUpdaterHook):
    """Cosine annealing restarted after each of ``periods`` (epochs or iterations); at the
    start of period i the learning rate is ``target + restart_weights[i] * (base - target)``.
    The periods must cover the whole run."""

    def __init__(self, periods, restart_weights=(1,), min_lr=None, min_lr_ratio=None, **kwargs):
        owner = type(self).__name__
        if not isinstance(periods, (list, tuple)) or not periods or \
                not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in periods):
            raise ConfigError(f'{owner}: periods must be a non-empty list of positive ints, got {periods!r}')
        if not isinstance(restart_weights, (list, tuple)) or len(restart_weights) != len(periods):
            raise ConfigError(f'{owner}: restart_weights must be a list with one weight per period '
                              f'({len(periods)}), got {restart_weights!r}')
        for weight in restart_weights:
            check_number(owner, 'restart_weights item', weight)
        self.init_policy(min_lr, min_lr_ratio)
        self.periods, self.restart_weights = list(periods), list(restart_weights)
        super().__init__(**kwargs)

    def prepare(self, trainer):
        _, max_progress = self.progress(trainer)
        if sum(self.periods) < max_progress:
            unit = 'epochs' if self.by_epoch else 'iterations'
            raise ConfigError(f'{type(self).__name__}: periods {self.periods} cover {sum(self.periods)} {unit} '
                              f'but the run has {max_progress}; lengthen the periods')

    def value(self, trainer, base):
        return schedules.cosine_restart_value(base, self.progress(trainer)[0], self.periods, self.restart_weights,
                                              self.target(base))


@HOOKS.register_module()
class LinearAnnealingLrUpdaterHook(LinearAnnealingPolicy, LrUpdaterHook):
    """A straight line from the base learning rate to ``min_lr`` / ``base * min_lr_ratio``."""

    def __init__(self, min_lr=None, min_lr_ratio=None, **kwargs):
        self.init_policy(min_lr, min_lr_ratio)
        super().__init__(**kwargs)


@HOOKS.register_module()
class CyclicLrUpdaterHook(CyclicPolicy, LrUpdaterHook):
    """Cyclic learning rate (per iteration only): ``cyclic_times`` cycles, each rising from
    the base to ``base * target_ratio[0]`` during ``step_ratio_up`` of the cycle, then falling
    to ``base * target_ratio[1]``; ``gamma`` in (0, 1] shrinks each later cycle's peak.

    ``target_ratio``: a number r (meaning ``(r, r / 1e5)``) or a pair; ``anneal_strategy``:
    ``'cos'`` or ``'linear'``.
    """

    def __init__(self, by_epoch=False, target_ratio=(10, 1e-4), cyclic_times=1, step_ratio_up=0.4,
                 anneal_strategy='cos', gamma=1, **kwargs):
        self.init_policy(target_ratio, cyclic_times, step_ratio_up, anneal_strategy, gamma)
        super().__init__(by_epoch=by_epoch, **kwargs)


@HOOKS.register_module()
class OneCycleLrUpdaterHook(OneCyclePolicy, LrUpdaterHook):
    """The 1cycle policy (per iteration only). The base learning rate of every group is
    ``max_lr / div_factor`` whatever the optimizer says; it rises to ``max_lr`` by
    ``pct_start * total_steps`` and anneals to ``base / final_div_factor`` at ``total_steps``.

    Args:
        max_lr: a number, or a list with one per parameter group.
        total_steps: the cycle length; ``None`` uses the run's ``max_iters``. Must be at
            least ``max_iters``.
        pct_start: a float in [0, 1]; anneal_strategy: ``'cos'`` or ``'linear'``;
        div_factor, final_div_factor; three_phase: go back to the base before the final fall.
    """

    def __init__(self, max_lr, total_steps=None, pct_start=0.3, anneal_strategy='cos', div_factor=25,
                 final_div_factor=1e4, three_phase=False, by_epoch=False, **kwargs):
        owner = type(self).__name__
        self.max_lr = check_number_or_list(owner, 'max_lr', max_lr)
        if total_steps is not None:
            check_number(owner, 'total_steps', total_steps, low=0, low_open=True, integer=True)
        self.total_steps = total_steps
        self.init_policy(pct_start, anneal_strategy, three_phase)
        self.div_factor = check_number(owner, 'div_factor', div_factor, low=0, low_open=True)
        self.final_div_factor = check_number(owner, 'final_div_factor', final_div_factor, low=0, low_open=True)
        self.cycle_steps = total_steps
        super().__init__(by_epoch=by_epoch, **kwargs)

    def read_base(self, trainer):
        groups = trainer.optimizer.param_groups
        base = [lr / self.div_factor for lr in per_group(type(self).__name__, 'max_lr', self.max_lr, groups)]
        param_groups.base_values(groups, 'initial_lr', base)
        return base

    def prepare(self, trainer):
        owner = type(self).__name__
        if self.total_steps is None:
            if not trainer.max_iters:
                raise ConfigError(f'{owner}: total_steps is not given and the run has no max_iters to infer it '
                                  'from; set total_steps')
            self.cycle_steps = trainer.max_iters
        elif trainer.max_iters and self.total_steps < trainer.max_iters:
            raise ConfigError(f'{owner}: total_steps={self.total_steps} is less than the run\'s '
                              f'max_iters={trainer.max_iters}')
        else:
            self.cycle_steps = self.total_steps
        self.check_phases(self.cycle_steps, 'steps', '; raise pct_start or the steps')

    def value(self, trainer, base):
        return schedules.one_cycle_lr(base, trainer.iter, self.cycle_steps, self.pct_start, self.div_factor,
                                      self.final_div_factor, self.three_phase, self.anneal_strategy)


__all__ = ['LrUpdaterHook', 'FixedLrUpdaterHook', 'StepLrUpdaterHook', 'ExpLrUpdaterHook', 'PolyLrUpdaterHook',
           'InvLrUpdaterHook', 'CosineAnnealingLrUpdaterHook', 'FlatCosineAnnealingLrUpdaterHook',
           'CosineRestartLrUpdaterHook', 'LinearAnnealingLrUpdaterHook', 'CyclicLrUpdaterHook',
           'OneCycleLrUpdaterHook']
