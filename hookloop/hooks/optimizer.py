"""The optimizer step: backward, accumulation, clipping, mixed precision and the step itself.

One hook, ``OptimizerHook``, owns the step; accumulation, clipping and fp16/bf16 are its
options, so the MMCV foot-gun of two stepping hooks cannot happen (role ``'optimizer'`` is
exclusive). The work is done by an ``OptimizerProcessor``, which a hook or an integration
(DeepSpeed-style engines) may replace with ``OptimizerHook.set_processor``.

Accumulation windows: with ``cumulative_iters=N`` the iterations of an epoch are cut into
windows of N starting at ``inner_iter`` 0; the last window of an epoch holds what is left
(``min(N, epoch_length - start)``). Every loss is divided by the size of its window and the
optimizer steps at the window's last iteration, so every epoch ends fully stepped.

A hook that wants this iteration's update dropped (``CheckInvalidLossHook``) calls
``trainer.step.skip(reason)`` in ``after_train_iter`` before this hook runs (it declares
``RUNS_BEFORE = ('optimizer',)``): the loss is not back-propagated and the whole window it
belongs to ends without a step (gradients of the window are discarded), like a ``GradScaler``
step with inf/NaN gradients. The trainer clears the decision before every iteration.

What this hook publishes (``hookloop/engine/step.py``): ``trainer.step.accumulation`` (hence
``trainer.step.window``) and ``trainer.step.val_forward_context`` at set-up,
``trainer.step.forward_context`` at set-up or, when it changes along a window (DDP's
``no_sync``), at each ``before_train_iter``; otherwise that stage is never called.
Set-up (the GradScaler, autocast, zeroed gradients) happens once per trainer, so a second
``train()`` after a stop keeps the scaler and a half-done accumulation window.
"""
import contextlib

import torch

from ..optim.amp import autocast_factory, build_grad_scaler, check_loss_scale, check_precision, enable_fp16, \
    scale_tensor
from ..errors import CheckpointError, ConfigError
from ..priority import Priority
from ..registry import HOOKS
from ..optim.accumulation import accumulation_window
from ..optim.step_options import check_cumulative_iters, check_grad_clip, optimized_params, total_loss
from ..optim.scale_book import ScaleBook, skipped_run
from .base import NEVER, Hook
from .blind_spots import hook_blind_spots

# Processor methods whose override does not change when the iteration stages have work.
PROCESSOR_SAFE = ('initialize_optimizer', 'before_run', 'after_run', 'state_dict', 'load_state_dict')


class OptimizerProcessor:
    """Does backward and the optimizer step. Swap it with ``OptimizerHook.set_processor``
    to change how a step is made without copying the hook.

    The API a replacement implements: ``initialize_optimizer(trainer)`` (the hook's
    ``setup``, once per trainer), ``before_forward(trainer, cumulative_iters)``
    (before_train_iter; sets ``trainer.step.forward_context``),
    ``backward(trainer, loss_keys, cumulative_iters, grad_clip)`` (after_train_iter; must
    honour ``trainer.step.skipped``), and optionally ``state_dict()``/``load_state_dict()``,
    ``before_run(trainer)``/``after_run(trainer)`` (every run's start and end, however it ends)
    and ``next_call(trainer, stage, start, cumulative_iters)`` (as :meth:`hookloop.Hook.next_call`;
    without it both stages run at every iteration).

    Args:
        precision: None/'fp32', 'fp16' (autocast + GradScaler) or 'bf16' (autocast).
        loss_scale: for fp16: 'dynamic'/None (GradScaler defaults), a number (static scale),
            or a dict of GradScaler arguments.
        detect_anomalous_params: log trainable parameters that got no gradient.
    """

    def __init__(self, precision=None, loss_scale=None, detect_anomalous_params=False):
        self.precision = check_precision(precision)
        self.loss_scale = check_loss_scale(loss_scale)
        self.detect_anomalous_params = bool(detect_anomalous_params)
        self.optimizer = self.scaler = None
        self._skip_window = False  # the current window holds a dropped iteration: no step at its end
        self._skipped_run = None  # fp16: steps the GradScaler skipped in a row (a device tensor)
        self._scale_book = None  # fp16: a ScaleBook, when the optimizer says on the host which steps ran
        self._pending_state = None  # a state loaded before the optimizer was known
        self._reported_unused = set()
        self._ddp = False
        self._contexts = {True: contextlib.nullcontext, False: contextlib.nullcontext}

    # -- set-up ----------------------------------------------------------------------------
    def initialize_optimizer(self, trainer):
        self.optimizer, self.model, self.logger = trainer.optimizer, trainer.model, trainer.logger
        autocast = None
        if self.precision == 'fp16':
            self._check_fp16_params(trainer.model)
            self.scaler = build_grad_scaler(self.loss_scale, trainer.device)
            if self._scale_book is not None:
                self._scale_book.close()
            self._scale_book = ScaleBook.attach(self.scaler, self.optimizer, isinstance(self.loss_scale, float))
            trainer.step.loss_scaling = True  # inf/NaN gradients skip a step: not a failure by itself
            if not enable_fp16(trainer.model):  # an MMCV-style model's auto_fp16 methods choose what runs in fp16
                autocast = autocast_factory(trainer.device, 'fp16')
        elif self.precision == 'bf16':
            autocast = autocast_factory(trainer.device, 'bf16')
        if autocast is not None:
            trainer.step.val_forward_context = autocast
        self._contexts = self._forward_contexts(trainer.wrapped_model, autocast)
        trainer.step.forward_context = self._contexts[True]  # for good, unless it varies along a window
        self._ddp = isinstance(trainer.wrapped_model, torch.nn.parallel.DistributedDataParallel) and \
            torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        self.optimizer.zero_grad(set_to_none=True)
        if self._pending_state is not None:
            self._apply_state(self._pending_state)

    @staticmethod
    def _check_fp16_params(model):
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not any(p.dtype == torch.float32 for _, p in trainable):
            found = 'only ' + str(sorted({str(p.dtype) for _, p in trainable})) if trainable else 'none trainable'
            raise ConfigError("OptimizerHook precision='fp16' needs trainable float32 parameters (autocast runs "
                              'the ops in fp16, the GradScaler unscales float32 gradients); the model has ' + found)
        low = [name for name, p in trainable if p.dtype in (torch.float16, torch.bfloat16)]
        if low:
            raise ConfigError(f"OptimizerHook precision='fp16': parameters {low[:5]} are already float16/bfloat16; "
                              'keep the weights in float32 (do not call model.half()): autocast casts per op')

    @staticmethod
    def _forward_contexts(wrapped_model, autocast):
        """``{window end?: zero-arg context factory}``: inside a window a DDP-style wrapper's
        ``no_sync`` joins the autocast, so gradients are reduced once per window."""
        at_end = autocast or contextlib.nullcontext
        no_sync = getattr(wrapped_model, 'no_sync', None)
        if no_sync is None:
            return {True: at_end, False: at_end}

        def inside_window():
            stack = contextlib.ExitStack()
            stack.enter_context(no_sync())
            if autocast is not None:
                stack.enter_context(autocast())
            return stack
        return {True: at_end, False: inside_window}

    def before_run(self, trainer):
        """A run starts (after ``initialize_optimizer``, and again for every later ``train()``)."""
        if self._scale_book is not None:
            self._scale_book.open()

    def after_run(self, trainer):
        """The run ended, however: the user's optimizer keeps no step hook of hookloop's."""
        if self._scale_book is not None:
            self._scale_book.close()

    # -- the step --------------------------------------------------------------------------
    def next_call(self, trainer, stage, start, cumulative_iters=1):
        """``before_forward`` only matters where the forward context changes along a window."""
        if stage == 'before_train_iter' and (cumulative_iters == 1 or self._contexts[True] is self._contexts[False]):
            return NEVER
        return None

    def before_forward(self, trainer, cumulative_iters=1):
        start, size = accumulation_window(trainer.inner_iter, trainer.epoch_length, cumulative_iters)
        trainer.step.forward_context = self._contexts[trainer.inner_iter == start + size - 1]

    def backward(self, trainer, loss_keys, cumulative_iters, grad_clip):
        if cumulative_iters == 1:
            size, window_end = 1, True
        else:  # trainer.step.window, computed here without the property's calls
            inner = trainer.position.inner_iter
            start = inner - inner % cumulative_iters
            size = min(cumulative_iters, trainer.step.epoch_length - start)
            window_end = inner == start + size - 1
        if trainer.step.skip_reason is not None:
            self._skip_window = True
        if not self._skip_window:
            loss = trainer.outputs.get(loss_keys[0]) if len(loss_keys) == 1 else None
            if loss is None:
                loss = total_loss(trainer.outputs, loss_keys)  # several keys, or a clear error
            if size > 1:
                loss = loss / size
            if self.scaler is not None:
                loss = self.scaler.scale(loss)
            loss.backward()
        if not window_end:
            return
        if self._skip_window:  # drop the whole window, never half a step
            self._skip_window = False
        else:
            if self.detect_anomalous_params:
                self._report_unused_params()
            if grad_clip is None and self.scaler is None:
                self.optimizer.step()
            else:
                self._step(trainer, grad_clip)
        self.optimizer.zero_grad(set_to_none=True)

    def _step(self, trainer, grad_clip):
        """The step with clipping or a GradScaler (the plain step is made in :meth:`backward`)."""
        optimizer, scaler = self.optimizer, self.scaler
        if grad_clip is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)  # clip the true gradients
            params = [p for p in optimized_params(optimizer) if p.grad is not None]
            if 'clip_value' in grad_clip:
                torch.nn.utils.clip_grad_value_(params, grad_clip['clip_value'])
            elif params:
                norm = torch.nn.utils.clip_grad_norm_(params, **grad_clip)
                trainer.meters.update('grad_norm', norm)  # a device tensor: no host sync here
        if scaler is None:
            optimizer.step()
            return
        book = self._scale_book
        if book is not None and not book.is_open:
            book = None  # a step outside a run (the step hook is off): the per-step way
        if book is not None:
            ran = book.steps_ran
        scaler.step(optimizer)  # one host sync inside torch: skip the step on inf/NaN gradients
        if book is None:
            run = skipped_run(scaler, optimizer, self._skipped_run)  # (see hookloop/optim/scale_book.py)
            if run is not None:  # published for the invalid-loss guard, read at log events
                self._skipped_run = run
                trainer.meters.update('skipped_steps', run)
        if isinstance(self.loss_scale, float):
            scaler.update(new_scale=self.loss_scale)  # static scale, kept fixed as MMCV does
        else:
            scaler.update()
        if book is not None:
            book.record(trainer.meters, book.steps_ran == ran)
        else:
            trainer.meters.update('loss_scale', scale_tensor(scaler))

    def _report_unused_params(self):
        unused = tuple(name for name, p in self.model.named_parameters() if p.requires_grad and p.grad is None)
        if unused and unused not in self._reported_unused:
            self._reported_unused.add(unused)
            self.logger.warning('detect_anomalous_params: %d trainable parameter(s) got no gradient (not in the '
                                'graph of the loss): %s', len(unused), ', '.join(unused))

    # -- state -----------------------------------------------------------------------------
    def state_dict(self):
        """The GradScaler state and, inside an accumulation window, the gradients so far."""
        state = {}
        if self.scaler is not None:
            state['scaler'] = self.scaler.state_dict()
        if self._skip_window:
            state['skip_window'] = True
        if self.optimizer is not None:
            grads = [p.grad for p in optimized_params(self.optimizer)]
            if any(g is not None for g in grads):
                # cloned: the next backward adds into .grad in place
                state['grads'] = [None if g is None else g.detach().clone() for g in grads]
                if self._ddp:
                    self._average_across_ranks(state['grads'])
        return state

    @staticmethod
    def _average_across_ranks(grads):
        """Inside a window DDP has not reduced yet (no_sync): each rank holds its own partial sum
        and only rank 0's checkpoint is written. DDP averages at the window end and averaging is
        linear, so the average of the partial sums, loaded on every rank, gives the same step (up
        to summation order). A collective: every rank must take the state (save_checkpoint does)."""
        world_size = torch.distributed.get_world_size()
        for grad in grads:
            if grad is not None:
                torch.distributed.all_reduce(grad)
                grad.div_(world_size)

    def load_state_dict(self, state):
        self._pending_state = dict(state)
        if self.optimizer is not None:
            self._apply_state(self._pending_state)

    def _apply_state(self, state):
        self._pending_state = None
        if 'scaler' in state and self.scaler is not None:
            self.scaler.load_state_dict(state['scaler'])
            if self._scale_book is not None:
                self._scale_book.loaded(state['scaler'])
        self._skip_window = bool(state.get('skip_window', False))
        grads = state.get('grads')
        if grads is None:
            return
        params = optimized_params(self.optimizer)
        if len(grads) != len(params):
            raise CheckpointError(f'the checkpoint holds accumulated gradients for {len(grads)} parameters, '
                                  f'the optimizer has {len(params)}')
        for param, grad in zip(params, grads):
            param.grad = None if grad is None else grad.to(device=param.device, dtype=param.dtype)


@HOOKS.register_module()
class OptimizerHook(Hook):
    """Back-propagates ``loss_keys`` of the step's outputs and steps the optimizer.

    Args:
        grad_clip: None, ``dict(max_norm=..., norm_type=2)`` (``clip_grad_norm_``; norm_type 2,
            1, ``inf``/``'inf'``...; the total norm before clipping is logged as ``grad_norm``)
            or ``dict(clip_value=...)`` (``clip_grad_value_``). Under fp16 the gradients are
            unscaled first.
        cumulative_iters: accumulate gradients over windows of this many iterations (see the
            module docstring: windows restart at every epoch, the last one may be shorter).
        loss_keys: the output key(s) summed and back-propagated.
        detect_anomalous_params: log (once per pattern) trainable parameters without gradient.
        precision: None/'fp32', 'fp16' (autocast + GradScaler) or 'bf16' (autocast only).
        loss_scale: fp16 only (implies it when precision is None): 'dynamic', a number (static)
            or ``dict(init_scale, growth_factor, backoff_factor, growth_interval)``.

    Only one optimizer-stepping hook may be registered (role ``'optimizer'``).
    """

    PRIORITY = Priority.ABOVE_NORMAL
    ROLE = 'optimizer'
    EXCLUSIVE = True
    RUNS_BEFORE = ('checkpoint', 'evaluation')  # what is evaluated and saved is the stepped model

    def __init__(self, grad_clip=None, cumulative_iters=1, loss_keys='loss', detect_anomalous_params=False,
                 precision=None, loss_scale=None):
        owner = type(self).__name__
        if isinstance(loss_keys, str):
            loss_keys = [loss_keys]
        if not isinstance(loss_keys, (list, tuple)) or not loss_keys or \
                not all(isinstance(k, str) for k in loss_keys):
            raise ConfigError(f'{owner} loss_keys must be a key or a list of keys, got {loss_keys!r}')
        self.loss_keys = list(loss_keys)
        self.cumulative_iters = check_cumulative_iters(cumulative_iters, owner)
        self.grad_clip = check_grad_clip(grad_clip, owner)
        precision = check_precision(precision, owner)
        if loss_scale is not None:
            if precision is None:
                precision = 'fp16'
            elif precision != 'fp16':
                raise ConfigError(f"{owner} loss_scale={loss_scale!r} needs precision='fp16', got {precision!r}")
        if not isinstance(detect_anomalous_params, bool):
            raise ConfigError(f'{owner} detect_anomalous_params must be True or False, got {detect_anomalous_params!r}')
        self.precision = precision
        self.processor = OptimizerProcessor(precision, check_loss_scale(loss_scale, owner), detect_anomalous_params)
        self.name = 'OptimizerHook'  # one checkpoint key whichever config type built it

    def set_processor(self, processor):
        """Replace the object that does backward and step (see :class:`OptimizerProcessor`)."""
        self.processor = processor

    def setup(self, trainer):
        trainer.step.accumulation = self.cumulative_iters
        self.processor.initialize_optimizer(trainer)

    def before_run(self, trainer):
        start = getattr(self.processor, 'before_run', None)  # (optional in a processor's API)
        if start is not None:
            start(trainer)

    def after_run(self, trainer):
        end = getattr(self.processor, 'after_run', None)
        if end is not None:
            end(trainer)

    def next_call(self, trainer, stage, start):
        ask = getattr(self.processor, 'next_call', None)
        if ask is None or hook_blind_spots(self.processor, PROCESSOR_SAFE):
            return None  # a processor without a schedule, or a subclass its schedule cannot know
        return ask(trainer, stage, start, self.cumulative_iters)

    def before_train_iter(self, trainer):
        self.processor.before_forward(trainer, self.cumulative_iters)

    def after_train_iter(self, trainer):
        self.processor.backward(trainer, self.loss_keys, self.cumulative_iters, self.grad_clip)

    def state_dict(self):
        return self.processor.state_dict() if hasattr(self.processor, 'state_dict') else {}

    def load_state_dict(self, state):
        if hasattr(self.processor, 'load_state_dict'):
            self.processor.load_state_dict(state)


@HOOKS.register_module()
class GradientCumulativeOptimizerHook(OptimizerHook):
    """MMCV's config name for ``OptimizerHook(cumulative_iters=N, ...)``."""

    def __init__(self, cumulative_iters=1, **kwargs):
        super().__init__(cumulative_iters=cumulative_iters, **kwargs)


@HOOKS.register_module()
class Fp16OptimizerHook(OptimizerHook):
    """MMCV's config name for ``OptimizerHook(precision='fp16', loss_scale=...)``; the default
    ``loss_scale=512.`` (static) is MMCV's. ``coalesce``, ``bucket_size_mb`` and ``distributed``
    are accepted for MMCV configs and unused: DDP reduces the gradients."""

    def __init__(self, grad_clip=None, coalesce=True, bucket_size_mb=-1, loss_scale=512., distributed=True,
                 **kwargs):
        kwargs.setdefault('precision', 'fp16')
        super().__init__(grad_clip=grad_clip, loss_scale=loss_scale, **kwargs)


@HOOKS.register_module()
class GradientCumulativeFp16OptimizerHook(Fp16OptimizerHook):
    """MMCV's config name for ``OptimizerHook(cumulative_iters=N, precision='fp16', loss_scale=...)``."""

    def __init__(self, cumulative_iters=1, **kwargs):
        super().__init__(cumulative_iters=cumulative_iters, **kwargs)


__all__ = ['OptimizerHook', 'GradientCumulativeOptimizerHook', 'Fp16OptimizerHook',
           'GradientCumulativeFp16OptimizerHook', 'OptimizerProcessor', 'accumulation_window']
