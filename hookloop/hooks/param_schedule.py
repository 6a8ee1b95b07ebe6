"""The shared base of the LR and momentum updaters: when values are computed and set.

MMCV 1.x timing, which both updaters keep:
  * ``setup`` (once per trainer): the base value of each parameter group is read (``initial_lr`` /
    ``initial_momentum`` in the group, set from the current value if absent);
  * ``by_epoch=True``: the regular value is computed and set in ``before_train_epoch``;
    ``before_train_iter`` only acts during warm-up, which is counted in iterations;
  * ``by_epoch=False``: everything happens in ``before_train_iter``.
The regular value is a pure function of (epoch or iteration, max), so resuming needs no state.

The policies that exist for both the learning rate and the momentum (Step, CosineAnnealing,
LinearAnnealing, Cyclic, OneCycle) keep their checks and values here, in mixins that both
hooks of a policy use; see "Policies" below.
"""
import inspect
import numbers

from ..errors import ConfigError
from ..optim import schedules
from ..optim.schedules import WARMUP_KINDS
from .base import NEVER, Hook


def check_number(owner, name, value, low=None, high=None, low_open=False, high_open=False, integer=False):
    """Raise ConfigError naming ``owner.name`` unless ``value`` is a number in the range."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f'{owner}: {name} must be {"an int" if integer else "a number"}, got {value!r}')
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        if low == 0 and low_open and high is None:
            raise ConfigError(f'{owner}: {name} must be positive, got {value!r}')
        left = '(' if low_open else '['
        right = ')' if high_open else ']'
        raise ConfigError(f'{owner}: {name} must be in {left}{"-inf" if low is None else low}, '
                          f'{"inf" if high is None else high}{right}, got {value!r}')
    return value


def check_step(owner, step):
    """``step``: a positive int, or a strictly increasing list of positive ints (``[]``: no
    decay, as MMCV allows)."""
    if isinstance(step, bool):
        raise ConfigError(f'{owner}: step must be a positive int or an increasing list of them, got {step!r}')
    if isinstance(step, int):
        check_number(owner, 'step', step, low=0, low_open=True, integer=True)
        return step
    if not isinstance(step, (list, tuple)) or \
            not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in step):
        raise ConfigError(f'{owner}: step must be a positive int or an increasing list of positive ints, '
                          f'got {step!r}')
    for before, after in zip(step, step[1:]):
        if after <= before:
            raise ConfigError(f'{owner}: step milestones must be strictly increasing, got {list(step)} '
                              f'({after} follows {before})')
    return list(step)


def check_min_value(owner, name, min_value, min_ratio):
    """Exactly one of ``min_<name>`` and ``min_<name>_ratio`` (MMCV's rule for annealing)."""
    if (min_value is None) == (min_ratio is None):
        got = 'both' if min_value is not None else 'neither'
        raise ConfigError(f'{owner}: give exactly one of min_{name} and min_{name}_ratio (got {got}: '
                          f'min_{name}={min_value!r}, min_{name}_ratio={min_ratio!r})')
    if min_value is not None:
        check_number(owner, f'min_{name}', min_value)
    else:
        check_number(owner, f'min_{name}_ratio', min_ratio)


def check_anneal(owner, anneal_strategy):
    if anneal_strategy not in ('cos', 'linear'):
        raise ConfigError(f"{owner}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
    return anneal_strategy


def check_target_ratio(owner, target_ratio):
    """MMCV's forms: a number ``r`` means ``(r, r / 1e5)``; a 1-tuple likewise; else a pair."""
    if isinstance(target_ratio, numbers.Real) and not isinstance(target_ratio, bool):
        return (target_ratio, target_ratio / 1e5)
    if isinstance(target_ratio, (list, tuple)) and len(target_ratio) in (1, 2) and \
            all(isinstance(r, numbers.Real) and not isinstance(r, bool) for r in target_ratio):
        if len(target_ratio) == 1:
            return (target_ratio[0], target_ratio[0] / 1e5)
        return tuple(target_ratio)
    raise ConfigError(f'{owner}: target_ratio must be a number or a pair of numbers, got {target_ratio!r}')


def check_number_or_list(owner, name, value):
    """A number, or a list with one per parameter group (its length is checked by ``per_group``)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, list, tuple)):
        raise ConfigError(f'{owner}: {name} must be a number or a list (one per parameter group), got {value!r}')
    return value


def per_group(owner, name, value, groups):
    """A number -> one per parameter group; a list must have one per group."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [value] * len(groups)
    if isinstance(value, (list, tuple)) and len(value) == len(groups):
        return list(value)
    raise ConfigError(f'{owner}: {name} must be a number or a list of {len(groups)} numbers (one per '
                      f'parameter group), got {value!r}')


class ParamScheduleHook(Hook):
    """Sets one value of every parameter group (the learning rate, the momentum) from a
    schedule and an optional warm-up. A policy defines ``value(trainer, base)``.

    Args:
        by_epoch: the schedule advances per epoch (else per iteration).
        warmup: ``None``, ``'constant'``, ``'linear'`` or ``'exp'``.
        warmup_iters: how long warm-up lasts, in iterations (in epochs with ``warmup_by_epoch``).
        warmup_ratio: in (0, 1] (for a linear LR warm-up [0, 1]: 0 starts from 0, as
            diffusers' schedulers); warm-up starts at ``ratio`` times the regular learning
            rate (momentum: divided by it).
        warmup_by_epoch: count ``warmup_iters`` in epochs (converted with the loader's length).
    """

    VALUE_NAME = None  # the value driven, as argument names and messages spell it: 'lr', 'momentum'
    WARMUP_RATIO = 0.1
    BY_ITER_ONLY = False  # Cyclic and OneCycle advance per iteration only

    def __init__(self, by_epoch=True, warmup=None, warmup_iters=0, warmup_ratio=None, warmup_by_epoch=False):
        owner = type(self).__name__
        if warmup_ratio is None:
            warmup_ratio = self.WARMUP_RATIO
        if not isinstance(by_epoch, bool):
            raise ConfigError(f'{owner}: by_epoch must be True or False, got {by_epoch!r}')
        if self.BY_ITER_ONLY and by_epoch:
            raise ConfigError(f'{owner} works per iteration only: set by_epoch=False (as in MMCV)')
        if warmup is not None:
            if warmup not in WARMUP_KINDS:
                raise ConfigError(f'{owner}: warmup must be None or one of {", ".join(map(repr, WARMUP_KINDS))}, '
                                  f'got {warmup!r}')
            check_number(owner, 'warmup_iters', warmup_iters, low=0, low_open=True, integer=True)
            # A linear LR warm-up may start from 0 (diffusers' warm-up); a ratio that divides
            # (momentum) or is a power base (exp) may not.
            from_zero = warmup == 'linear' and self.VALUE_NAME == 'lr'
            check_number(owner, 'warmup_ratio', warmup_ratio, low=0, high=1, low_open=not from_zero)
        self.by_epoch = by_epoch
        self.warmup = warmup
        self.warmup_ratio = warmup_ratio
        self.warmup_by_epoch = warmup_by_epoch
        # MMCV's attributes: warmup_iters counts iterations (with warmup_by_epoch: None until
        # set-up converts warmup_epochs with the loader's length)
        self.warmup_epochs = warmup_iters if warmup_by_epoch else None
        self.warmup_iters = None if warmup_by_epoch else warmup_iters
        self.base_values = []
        self.regular_values = []

    @property
    def warmup_total(self):
        """How long warm-up lasts, in iterations (``warmup_iters`` once set up)."""
        return self.warmup_iters

    def __init_subclass__(cls, **kwargs):
        # A policy's __init__ takes its own arguments and passes **kwargs to the base: publish
        # the combined signature (through every level of **kwargs) so config checks name a
        # misspelt argument and suggest the right one (the registry reads it), instead of a
        # bare TypeError from the base.
        super().__init_subclass__(**kwargs)
        if '__init__' in vars(cls):
            cls.__signature__ = published_signature(cls)

    # -- what subclasses provide ------------------------------------------------------------
    def value(self, trainer, base):
        """The policy: the regular value of a group whose base value is ``base``."""
        raise NotImplementedError

    def get_value(self, trainer, base):
        """What the stages call; the LR / momentum hooks route it through MMCV's
        ``get_lr`` / ``get_momentum``, so subclasses written for MMCV keep working."""
        return self.value(trainer, base)

    def read_base(self, trainer):
        """The base value of each parameter group."""
        raise NotImplementedError

    def write(self, groups, values):
        raise NotImplementedError

    def warmup_values(self, cur_iter, regular):
        raise NotImplementedError

    def prepare(self, trainer):
        """Called at set-up after the base values are read: check the run fits the schedule."""

    # -- helpers ----------------------------------------------------------------------------
    def progress(self, trainer):
        """``(progress, max_progress)``: the epoch or the iteration, and their maximum."""
        if self.by_epoch:
            return trainer.epoch, trainer.max_epochs
        return trainer.iter, trainer.max_iters

    def regular(self, trainer):
        """The regular value of every group (the LR / momentum hooks: MMCV's
        ``get_regular_lr`` / ``get_regular_momentum``, which subclasses may override)."""
        return [self.get_value(trainer, base) for base in self.base_values]

    # -- stages -----------------------------------------------------------------------------
    def setup(self, trainer):  # once per trainer: the base values belong to the optimizer
        if trainer.optimizer is None:
            raise ConfigError(f'{type(self).__name__} needs an optimizer')
        self.base_values = self.read_base(trainer)
        if self.warmup_by_epoch:
            self.warmup_iters = self.warmup_epochs * trainer.iters_per_epoch
        self.prepare(trainer)

    def after_load_checkpoint(self, trainer, checkpoint):
        # The optimizer state brings the saved initial values back; MMCV resumes before
        # before_run, so the saved ones win there too.
        self.base_values = self.read_base(trainer)

    def before_train_epoch(self, trainer):
        if not self.by_epoch:
            return
        self.regular_values = self.regular(trainer)
        self.write(trainer.optimizer.param_groups, self.regular_values)

    def next_call(self, trainer, stage, start):
        if stage != 'before_train_iter':
            return None  # a stage this schedule was not written for
        if not self.by_epoch:
            return None
        return start if self.warmup is not None and start <= self.warmup_iters else NEVER

    def before_train_iter(self, trainer):
        cur_iter = trainer.iter
        if not self.by_epoch:
            self.regular_values = self.regular(trainer)
            if self.warmup is None or cur_iter >= self.warmup_iters:
                self.write(trainer.optimizer.param_groups, self.regular_values)
            else:
                self.write(trainer.optimizer.param_groups, self.warmup_values(cur_iter, self.regular_values))
        elif self.warmup is not None and cur_iter <= self.warmup_iters:
            # by epoch: the epoch's regular value is already set; warm-up scales it
            if cur_iter == self.warmup_iters:
                self.write(trainer.optimizer.param_groups, self.regular_values)
            else:
                self.write(trainer.optimizer.param_groups, self.warmup_values(cur_iter, self.regular_values))


def published_signature(cls):
    """``cls``'s constructor signature with what its ``**kwargs`` reach: the arguments of the
    next ``__init__`` up the MRO, through any number of levels; ``**kwargs`` stays only when
    the chain ends in one (None: ``cls.__init__``'s own signature, nothing to add)."""
    own = list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self
    if not any(p.kind is p.VAR_KEYWORD for p in own):
        return None
    params = [p for p in own if p.kind is not p.VAR_KEYWORD]
    base = next((b for b in cls.__mro__[1:] if '__init__' in vars(b)), object)
    if base is object:
        return None
    names = {p.name for p in params}
    inherited = inspect.signature(base).parameters.values()  # the base's published one, when it has it
    params += [p.replace(kind=p.KEYWORD_ONLY) for p in inherited
               if p.name not in names and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    params += [p for p in inherited if p.kind is p.VAR_KEYWORD][:1]
    return inspect.Signature(sorted(params, key=lambda p: p.kind))  # kinds are ordered as a signature needs


# -- Policies ---------------------------------------------------------------------------------
# A policy that exists for both values is a mixin holding its arguments, their checks and
# ``value(trainer, base)``; ``StepLrUpdaterHook(StepPolicy, LrUpdaterHook)`` and
# ``StepMomentumUpdaterHook(StepPolicy, MomentumUpdaterHook)`` differ only in the names and
# defaults of their arguments, which their ``__init__`` spells out and hands to ``init_policy``.
# Messages name the arguments after the hook's ``VALUE_NAME`` (``min_lr``, ``min_momentum``).
# The mixins have no ``__init__``, so ``__init_subclass__`` publishes the hook's own arguments
# plus those of LrUpdaterHook / MomentumUpdaterHook.

class StepPolicy:
    """``base * gamma ** k``, k = steps reached, at least ``min_value`` when given."""

    def init_policy(self, step, gamma, min_value):
        owner = type(self).__name__
        self.step = check_step(owner, step)
        self.gamma = check_number(owner, 'gamma', gamma)
        self.min_value = None if min_value is None else check_number(owner, f'min_{self.VALUE_NAME}', min_value)

    def value(self, trainer, base):
        return schedules.step_value(base, self.progress(trainer)[0], self.step, self.gamma, self.min_value)


class AnnealingPolicy:
    """Anneals from the base value to ``min_value`` or ``base * min_ratio`` (exactly one given)."""

    def init_policy(self, min_value, min_ratio):
        check_min_value(type(self).__name__, self.VALUE_NAME, min_value, min_ratio)
        self.min_value, self.min_ratio = min_value, min_ratio
        # MMCV's names too (min_lr / min_lr_ratio, min_momentum / ...), which subclasses written for it read
        setattr(self, f'min_{self.VALUE_NAME}', min_value)
        setattr(self, f'min_{self.VALUE_NAME}_ratio', min_ratio)

    def target(self, base):
        return base * self.min_ratio if self.min_ratio is not None else self.min_value


class CosineAnnealingPolicy(AnnealingPolicy):
    def value(self, trainer, base):
        progress, max_progress = self.progress(trainer)
        return schedules.cosine_value(base, progress, max_progress, self.target(base))


class LinearAnnealingPolicy(AnnealingPolicy):
    def value(self, trainer, base):
        progress, max_progress = self.progress(trainer)
        return schedules.linear_annealing_value(base, progress, max_progress, self.target(base))


class CyclicPolicy:
    """``cyclic_times`` cycles over the run's iterations, from the base to ``base * target_ratio[0]``
    during ``step_ratio_up`` of a cycle, then to ``base * target_ratio[1]``."""

    BY_ITER_ONLY = True

    def init_policy(self, target_ratio, cyclic_times, step_ratio_up, anneal_strategy, gamma):
        owner = type(self).__name__
        self.target_ratio = check_target_ratio(owner, target_ratio)
        self.cyclic_times = check_number(owner, 'cyclic_times', cyclic_times, low=0, low_open=True, integer=True)
        self.step_ratio_up = check_number(owner, 'step_ratio_up', step_ratio_up, low=0, high=1, high_open=True)
        self.anneal_strategy = check_anneal(owner, anneal_strategy)
        self.gamma = check_number(owner, 'gamma', gamma, low=0, high=1, low_open=True)

    def prepare(self, trainer):
        if trainer.max_iters // self.cyclic_times < 1:
            raise ConfigError(f'{type(self).__name__}: cyclic_times={self.cyclic_times} is more than the '
                              f'{trainer.max_iters} iterations of the run')

    def value(self, trainer, base):
        return schedules.cyclic_value(base, trainer.iter, trainer.max_iters, self.target_ratio,
                                      self.cyclic_times, self.step_ratio_up, self.anneal_strategy, self.gamma)


class OneCyclePolicy:
    """The arguments and checks both 1cycle hooks share; their values differ."""

    BY_ITER_ONLY = True

    def init_policy(self, pct_start, anneal_strategy, three_phase):
        owner = type(self).__name__
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ConfigError(f'{owner}: pct_start must be a float in [0, 1], got {pct_start!r}')
        self.pct_start = pct_start
        self.anneal_strategy = check_anneal(owner, anneal_strategy)
        self.three_phase = bool(three_phase)

    def check_phases(self, steps, unit, advice=''):
        """Refuse a phase of zero length: it would divide by zero when reached (MMCV crashes there)."""
        ends = schedules.one_cycle_phases(steps, self.pct_start, self.three_phase)
        starts = [0] + ends[:-1]
        if any(end == start for start, end in zip(starts, ends)):
            raise ConfigError(f'{type(self).__name__}: pct_start={self.pct_start} with {steps} {unit} leaves a '
                              f'phase without iterations (phase ends {ends}){advice}')


__all__ = ['ParamScheduleHook', 'published_signature', 'check_number', 'check_step', 'check_min_value', 'check_anneal',
           'check_target_ratio', 'check_number_or_list', 'per_group', 'StepPolicy', 'AnnealingPolicy',
           'CosineAnnealingPolicy', 'LinearAnnealingPolicy', 'CyclicPolicy', 'OneCyclePolicy']
