"""ModelScope's LR warm-up (``lr_scheduler.options.warmup``) around a torch scheduler.

ModelScope multiplies the wrapped scheduler's regular LR during the first ``warmup_iters``
scheduler steps (epochs with ``by_epoch``, iterations otherwise):
``LinearWarmup``: ``1 - (1 - t / warmup_iters) * (1 - warmup_ratio)``;
``ConstantWarmup``: ``warmup_ratio``; ``ExponentialWarmup``: ``warmup_ratio ** (1 - t / warmup_iters)``.
"""
import torch

from ..errors import ConfigError
from ..optim import param_groups

WARMUP_FACTORS = {
    'LinearWarmup': lambda t, n, ratio: 1 - (1 - t / n) * (1 - ratio),
    'ConstantWarmup': lambda t, n, ratio: ratio,
    'ExponentialWarmup': lambda t, n, ratio: ratio ** (1 - t / n),
}


class WarmupScheduler(torch.optim.lr_scheduler.LRScheduler):
    """``base_scheduler``'s LR times the warm-up factor while ``last_epoch < warmup_iters``.
    The base scheduler always sees its own (regular) LR, so chainable schedules stay exact."""

    def __init__(self, base_scheduler, type='LinearWarmup', warmup_iters=0, warmup_ratio=0.1):  # noqa: A002
        if type not in WARMUP_FACTORS:
            raise ConfigError(f'warmup type {type!r} is unknown; known: {", ".join(WARMUP_FACTORS)}')
        if isinstance(warmup_iters, bool) or not isinstance(warmup_iters, int) or warmup_iters < 0:
            raise ConfigError(f'warmup_iters must be an int >= 0, got {warmup_iters!r}')
        self.base, self.kind, self.warmup_iters, self.warmup_ratio = base_scheduler, type, warmup_iters, warmup_ratio
        self.regular = [group['lr'] for group in base_scheduler.optimizer.param_groups]
        super().__init__(base_scheduler.optimizer)

    def factor(self, step):
        if step >= self.warmup_iters:
            return 1.0
        return WARMUP_FACTORS[self.kind](step, self.warmup_iters, self.warmup_ratio)

    def step(self, epoch=None):
        groups = self.optimizer.param_groups
        self.last_epoch += 1
        if self.last_epoch > 0:  # the base scheduler made its first step when it was built
            param_groups.set_lr(groups, self.regular)
            self.base.step()
        self.regular = [group['lr'] for group in groups]
        factor = self.factor(self.last_epoch)
        param_groups.set_lr(groups, [lr * factor for lr in self.regular])
        self._last_lr = [group['lr'] for group in groups]

    def get_lr(self):
        return [group['lr'] for group in self.optimizer.param_groups]

    def state_dict(self):
        return {'last_epoch': self.last_epoch, 'regular': list(self.regular), 'base': self.base.state_dict()}

    def load_state_dict(self, state):
        self.last_epoch, self.regular = state['last_epoch'], list(state['regular'])
        self.base.load_state_dict(state['base'])


class AccumulationDelay(torch.optim.lr_scheduler.LRScheduler):
    """ModelScope's per-iteration stepping with gradient accumulation: its ``LrSchedulerHook``
    steps after iteration ``i`` only once ``i >= cumulative_iters - 1``, so the first
    ``cumulative_iters - 1`` steps of ``scheduler`` are left out and the schedule runs that
    many iterations behind one stepped every iteration."""

    def __init__(self, scheduler, cumulative_iters):
        if isinstance(cumulative_iters, bool) or not isinstance(cumulative_iters, int) or cumulative_iters < 1:
            raise ConfigError(f'cumulative_iters must be an int >= 1, got {cumulative_iters!r}')
        self.inner, self.skip = scheduler, cumulative_iters - 1
        super().__init__(scheduler.optimizer)

    def step(self, epoch=None):
        self.last_epoch += 1
        if self.last_epoch > self.skip:  # call k comes after iteration k - 1
            self.inner.step()
        self._last_lr = [group['lr'] for group in self.optimizer.param_groups]

    def get_lr(self):
        return [group['lr'] for group in self.optimizer.param_groups]

    def state_dict(self):
        return {'last_epoch': self.last_epoch, 'inner': self.inner.state_dict()}

    def load_state_dict(self, state):
        self.last_epoch = state['last_epoch']
        self.inner.load_state_dict(state['inner'])
