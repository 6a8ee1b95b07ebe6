"""Catch a NaN/Inf loss before it reaches the weights, and decide what happens then.

Role ``'invalid_loss'``, declared to run before the optimizer hook in every stage, whatever
the priorities (``RUNS_BEFORE``), so the step of the bad iteration has not happened yet.

Policies (``on_invalid``):

* ``'raise'`` (MMCV's behaviour): every ``interval`` iterations, look at the losses and
  raise ``InvalidLossError`` naming the iteration, the keys and the values. Costs one host
  sync per ``interval`` iterations; a bad loss between two checks is not seen.
* ``'skip'``: look every iteration; on a bad loss call ``trainer.step.skip(reason)``, which
  the optimizer hook honours by not back-propagating it and ending the accumulation window
  that holds it without a step (its gradients are discarded); the trainer frees the
  iteration's graph at the end of the iteration, before the next forward.
* ``'rollback'``: as ``skip``, and first restore everything the optimizer step touched from
  the last good snapshot kept in memory: the model, the optimizer state, and, through their
  documented ``state_dict``/``load_state_dict``, the states of the hooks in roles
  ``'optimizer'`` (GradScaler, accumulated gradients of the window) and ``'ema'`` (the
  averages). A snapshot (a copy of them on their device) is taken before the first iteration
  and then every ``interval`` iterations; it becomes "good" once the forward on those weights
  gives a finite loss. The window holding the bad loss is then dropped as with ``skip``.

``skip`` and ``rollback`` cost one host sync per iteration (the decision is needed before the
step): the read of the loss itself when it is one scalar (tested on the host, no kernel), else of
one fused test of all of them; ``rollback`` also one state copy per ``interval`` iterations (and
is called before an iteration only where it takes one). Under DDP the verdict is
all-reduced so that every rank drops the same steps.
"""
import copy
import math

import torch

from ..errors import ConfigError, InvalidLossError
from ..optim import param_groups
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook
from .order import role_of

POLICIES = ('raise', 'skip', 'rollback')
ROLLED_BACK_ROLES = ('optimizer', 'ema')


@HOOKS.register_module()
class CheckInvalidLossHook(Hook):
    """Args:
        interval: check (``'raise'``) or snapshot (``'rollback'``) every this many iterations.
        on_invalid: ``'raise'``, ``'skip'`` or ``'rollback'`` (see the module docstring).
        loss_keys: the output keys to check; default every tensor output whose key starts
            with ``'loss'``.
    """

    PRIORITY = Priority.VERY_LOW
    ROLE = 'invalid_loss'
    RUNS_BEFORE = ('optimizer',)  # a bad loss is caught before it reaches the weights

    def __init__(self, interval=50, on_invalid='raise', loss_keys=None):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'CheckInvalidLossHook interval must be a positive int, got {interval!r}')
        if on_invalid not in POLICIES:
            raise ConfigError(f'CheckInvalidLossHook on_invalid must be one of {list(POLICIES)}, got {on_invalid!r}')
        if isinstance(loss_keys, str):
            loss_keys = [loss_keys]
        if loss_keys is not None and (not loss_keys or not all(isinstance(k, str) for k in loss_keys)):
            raise ConfigError('CheckInvalidLossHook loss_keys must be None, a key or a list of keys, '
                              f'got {loss_keys!r}')
        self.interval, self.on_invalid, self.loss_keys = interval, on_invalid, loss_keys
        self._candidate = self._good = None  # rollback snapshots: (iteration, state)

    def _losses(self, outputs):
        if self.loss_keys is None:
            return {k: v for k, v in outputs.items() if k.startswith('loss') and isinstance(v, torch.Tensor)}
        missing = [k for k in self.loss_keys if k not in outputs]
        if missing:
            raise ConfigError(f'CheckInvalidLossHook loss_keys {missing} are not in the model outputs '
                              f'{list(outputs.keys())}')
        return {k: outputs[k] for k in self.loss_keys}

    def next_call(self, trainer, stage, start):
        if stage == 'before_train_iter':
            if self.on_invalid != 'rollback':
                return NEVER
            # the next snapshot: every iteration until one is good, then every ``interval`` (the
            # call at after_train_iter, every iteration, asks this stage again)
            return start if self._good is None else start + (-start) % self.interval
        return self.next_every_n_iters(start, self.interval) if self.on_invalid == 'raise' else None

    def before_train_iter(self, trainer):
        if self.on_invalid == 'rollback' and (self._good is None or trainer.iter % self.interval == 0):
            self._candidate = (trainer.iter, {
                'model': {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
                'optimizer': copy.deepcopy(trainer.optimizer.state_dict()),
                'hooks': {hook.name: copy.deepcopy(hook.state_dict()) for hook in _rolled_back(trainer)},
            })

    def after_train_iter(self, trainer):
        if self.on_invalid == 'raise' and not self.every_n_iters(trainer, self.interval):
            return
        losses = self._losses(trainer.outputs)
        if not losses:
            return
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            finite = _all_finite(losses.values()).to(torch.int32)
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
            finite = bool(finite)  # the documented host sync
        else:
            finite = _finite_on_host(losses)
        if finite:
            if self._candidate is not None:
                self._good, self._candidate = self._candidate, None
            return
        values = ', '.join(f'{k}={_show(v)}' for k, v in losses.items())
        where = f'iteration {trainer.iter + 1} (epoch {trainer.epoch + 1}, inner iteration {trainer.inner_iter + 1})'
        if self.on_invalid == 'raise':
            raise InvalidLossError(f'loss is not finite at {where}: {values}')
        if self.on_invalid == 'rollback':
            self._candidate = None
            if self._good is None:
                raise InvalidLossError(f'loss is not finite at {where}: {values}; no good state to roll back to')
            good_iter, state = self._good
            trainer.model.load_state_dict(state['model'])
            # keep the schedule where it is now: lr, momentum... are the LR/momentum hooks' business
            settings = param_groups.hyper_parameters(trainer.optimizer.param_groups)
            # a deep copy: the optimizer would otherwise share (and update) the snapshot's tensors
            trainer.optimizer.load_state_dict(copy.deepcopy(state['optimizer']))
            param_groups.restore_hyper_parameters(trainer.optimizer.param_groups, settings)
            rolled = ['model', 'optimizer']
            for hook in _rolled_back(trainer):
                if hook.name in state['hooks']:
                    hook.load_state_dict(copy.deepcopy(state['hooks'][hook.name]))
                    rolled.append(hook.name)
            trainer.logger.warning('loss is not finite at %s: %s; rolled %s back to their state before iteration %d '
                                   'and dropped this update', where, values, ', '.join(rolled), good_iter + 1)
        else:
            trainer.logger.warning('loss is not finite at %s: %s; dropped this update', where, values)
        trainer.step.skip(f'loss is not finite at {where}')


def _all_finite(losses):
    """One boolean device tensor: every element of every loss is finite."""
    losses = [loss.detach() for loss in losses]
    if len(losses) > 1 and all(loss.dim() == 0 for loss in losses):
        return torch.isfinite(torch.stack(losses)).all()  # three kernels, whatever the number of keys
    return torch.stack([torch.isfinite(loss).all() for loss in losses]).all()


def _finite_on_host(losses):
    """Whether every loss is finite, with the one host read the decision needs: the scalar loss
    itself (its value, tested on the host: no kernel), else the one boolean of :func:`_all_finite`."""
    if len(losses) == 1:
        (loss,) = losses.values()
        if loss.dim() == 0:
            return math.isfinite(loss.item())  # the documented host sync
    return bool(_all_finite(losses.values()))  # the documented host sync


def _rolled_back(trainer):
    """The hooks whose state the optimizer step changes, restored with the model."""
    return [hook for hook in trainer.hooks if role_of(hook) in ROLLED_BACK_ROLES
            and hasattr(hook, 'state_dict') and hasattr(hook, 'load_state_dict')]


def _show(value):
    value = value.detach()
    return f'{value.item():.6g}' if value.numel() == 1 else f'tensor of shape {tuple(value.shape)}'


__all__ = ['CheckInvalidLossHook']
