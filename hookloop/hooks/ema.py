"""EMAHook: an exponential moving average of the model's parameters (MMCV's rule)."""
import torch

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook


def ema_momentum(momentum, warm_up, step):
    """MMCV's momentum at (0-based) iteration ``step``: ``min(momentum, (1 + step) / (warm_up + step))``.

    With ``warm_up=0`` the ratio is above 1 from step 1 on, and unbounded at step 0:
    ``momentum`` throughout (no warm-up)."""
    if warm_up + step == 0:
        return momentum
    return min(momentum, (1 + step) / (warm_up + step))


def ema_update(averages, parameters, momentum):
    """In place: ``average = (1 - momentum) * average + momentum * parameter`` for each pair."""
    for average, parameter in zip(averages, parameters):
        average.mul_(1 - momentum).add_(parameter.detach(), alpha=momentum)


@HOOKS.register_module()
class EMAHook(Hook):
    """Keeps an exponential moving average of the model's parameters.

    After iteration ``t`` (0-based, ``trainer.iter``), when ``t % interval == 0``::

        m = min(momentum ** interval, (1 + t) / (warm_up + t))
        ema = (1 - m) * ema + m * parameter

    as MMCV's ``EMAHook`` does. The averages start as a copy of the parameters when the
    hook is set up (once per trainer, so ``train()`` again after a stop continues them);
    resuming from a checkpoint without this hook's state starts them from the resumed
    weights. Unlike MMCV, they are not added to the model as buffers: the model's
    ``state_dict`` keeps its own keys, and checkpoints carry the averages twice: in this
    hook's state (for resume) and as a top-level ``ema_state_dict`` with the keys of
    ``model.state_dict()`` (parameters averaged, buffers as in the model).

    The hook acts after the optimizer step and before evaluation and checkpoint hooks in
    every stage, whatever ``priority`` it is given (``RUNS_AFTER``/``RUNS_BEFORE``).
    Tied parameters (one tensor under two names) share one average, under both names.

    Args:
        momentum: weight of the new parameter value, in (0, 1).
        interval: update every ``interval`` iterations.
        warm_up: the ``warm_up`` of the momentum formula above (0: no warm-up).
        resume_from: a checkpoint to resume the whole run from (as in MMCV). The trainer reads
            this attribute (the ``resume_from`` contract of docs/hooks.md) and resumes at the start
            of the hook's first run, after ``setup`` and before ``before_run``, as with the trainer's
            own ``resume_from``, which is preferred (and wins when both are given).
        swap: evaluate with the averaged weights: they are swapped into the model for each
            validation loop and swapped back after it (training continues on the raw weights).
    """

    PRIORITY = Priority.NORMAL
    ROLE = 'ema'
    RUNS_AFTER = ('optimizer',)  # the average takes in this iteration's step
    RUNS_BEFORE = ('evaluation', 'checkpoint')  # evaluation may swap the averages in; checkpoints hold them

    def __init__(self, momentum=0.0002, interval=1, warm_up=100, resume_from=None, swap=False):
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 < momentum < 1:
            raise ConfigError(f'EMAHook momentum must be a number in (0, 1), got {momentum!r}')
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'EMAHook interval must be a positive int, got {interval!r}')
        if isinstance(warm_up, bool) or not isinstance(warm_up, (int, float)) or warm_up < 0:
            raise ConfigError(f'EMAHook warm_up must be a number >= 0, got {warm_up!r}')
        if resume_from is not None and not isinstance(resume_from, str):
            raise ConfigError(f'EMAHook resume_from must be a checkpoint path, got {resume_from!r}')
        self.momentum = momentum ** interval
        self.interval, self.warm_up, self.resume_from, self.swap = interval, warm_up, resume_from, swap
        self.averages = None  # parameter name -> averaged tensor
        self._swapped = False

    def setup(self, trainer):
        self._model = trainer.model
        self._parameters = dict(trainer.model.named_parameters())  # tied parameters appear once
        loaded = self.averages  # a state loaded before set-up
        self.averages = {name: p.detach().clone() for name, p in self._parameters.items()}
        # Fixed pairs: loading a checkpoint copies into these tensors, it never replaces them.
        self._pairs = ([self.averages[n] for n in self._parameters], list(self._parameters.values()))
        if loaded is not None:
            self.load_state_dict({'averages': loaded})

    def after_load_checkpoint(self, trainer, checkpoint):
        if self.name not in checkpoint.get('hooks', {}):  # a checkpoint saved without this hook
            self._restart_from_weights()

    @torch.no_grad()
    def _restart_from_weights(self):
        for average, parameter in zip(*self._pairs):
            average.copy_(parameter)

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        return start + (-start) % self.interval  # the next multiple of interval

    def after_train_iter(self, trainer):
        step = trainer.iter
        if step % self.interval != 0:
            return
        ema_update(*self._pairs, ema_momentum(self.momentum, self.warm_up, step))

    # -- evaluation with the averages --------------------------------------------------------
    def before_val_epoch(self, trainer):
        if self.swap and self.averages is not None:
            self._swap_weights()

    def after_val_epoch(self, trainer):
        if self._swapped:
            self._swap_weights()

    def after_run(self, trainer):
        if self._swapped:  # an error inside validation must not leave averages in the model
            self._swap_weights()

    @torch.no_grad()
    def _swap_weights(self):
        # Exchanging the tensors' contents (not copying through arithmetic) keeps both
        # sets bitwise intact, so training after validation is unchanged by the swap.
        for name, parameter in self._parameters.items():
            average = self.averages[name]
            held = parameter.detach().clone()
            parameter.copy_(average)
            average.copy_(held)
        self._swapped = not self._swapped

    # -- checkpoints -------------------------------------------------------------------------
    def _current_averages(self):
        if self._swapped:  # inside validation with swap=True the model holds the averages
            return {name: p.detach() for name, p in self._parameters.items()}
        return self.averages

    def ema_state_dict(self):
        """The averaged weights under the keys of ``model.state_dict()``; buffers (e.g.
        BatchNorm statistics) are copied from the model as they are. Keys are matched to
        parameters by tensor identity, so every name of a tied weight gets its average."""
        if self.averages is None or not hasattr(self, '_parameters'):
            raise ConfigError('EMAHook.ema_state_dict(): no averages yet (the run has not started)')
        averages = self._current_averages()
        by_tensor = {id(parameter): averages[name] for name, parameter in self._parameters.items()}
        return {key: by_tensor.get(id(value), value).detach().clone()
                for key, value in self._model.state_dict(keep_vars=True).items()}

    def before_save_checkpoint(self, trainer, checkpoint):
        checkpoint['ema_state_dict'] = self.ema_state_dict()

    def state_dict(self):
        return {'averages': {n: t.clone() for n, t in (self._current_averages() or {}).items()}}

    def load_state_dict(self, state):
        averages = state.get('averages', {})
        if self.averages is not None:
            missing = sorted(set(self.averages) - set(averages))
            if missing:
                raise ConfigError(f'EMAHook: the checkpoint has no averages for parameters {missing[:5]}')
            for name, tensor in self.averages.items():
                tensor.copy_(averages[name])
        else:
            self.averages = {n: t.clone() for n, t in averages.items()}
