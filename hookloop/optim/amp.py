"""Mixed precision: autocast contexts, GradScaler construction, and MMCV's model decorators.

Two ways to train in reduced precision:

* plain models: ``OptimizerHook(precision='fp16' | 'bf16')`` wraps every forward in
  ``torch.autocast`` (and, for fp16, scales the loss with ``torch.amp.GradScaler``);
* MMCV-style models: methods decorated with :func:`auto_fp16` / :func:`force_fp32` run in
  reduced precision only when the module's ``fp16_enabled`` is True; with ``precision='fp16'``
  the optimizer hook's set-up calls :func:`enable_fp16` (MMCV's ``wrap_fp16_model``, which
  ``Fp16OptimizerHook.before_run`` calls in MMCV) and leaves the forward alone, so only the
  decorated methods autocast (MMCV's behaviour).

``module.fp16_enabled`` has one writer in hookloop, :func:`enable_fp16` (docs/hooks.md, the
contract table): the optimizer processor's ``initialize_optimizer`` at set-up and
``hookloop.compat.mmcv.wrap_fp16_model``. Only modules that declare the attribute are touched.
"""
import functools
import inspect
import math
from collections.abc import Mapping

import torch

from ..errors import ConfigError

PRECISIONS = {None: None, 'fp32': None, 'fp16': torch.float16, 'bf16': torch.bfloat16}
SCALER_KEYS = ('init_scale', 'growth_factor', 'backoff_factor', 'growth_interval')


def check_precision(precision, owner='OptimizerHook'):
    """``precision`` if it is one of None, 'fp32', 'fp16', 'bf16'; ConfigError otherwise."""
    if not isinstance(precision, (str, type(None))) or precision not in PRECISIONS:
        raise ConfigError(f"{owner} precision must be one of None, 'fp32', 'fp16', 'bf16', got {precision!r}")
    return None if precision == 'fp32' else precision


def check_loss_scale(loss_scale, owner='OptimizerHook'):
    """Normalise ``loss_scale``: None/'dynamic' -> {} (GradScaler defaults), a positive number
    -> that float (static), a dict of GradScaler arguments -> that dict (dynamic)."""
    if loss_scale is None or loss_scale == 'dynamic':
        return {}
    if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
        if not math.isfinite(loss_scale) or loss_scale <= 0:
            raise ConfigError(f'{owner} loss_scale must be a positive finite number, got {loss_scale!r}')
        return float(loss_scale)
    if isinstance(loss_scale, Mapping):
        unknown = sorted(set(loss_scale) - set(SCALER_KEYS))
        if unknown:
            raise ConfigError(f'{owner} loss_scale got unknown keys {unknown}; allowed: {list(SCALER_KEYS)}')
        for key, value in loss_scale.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f'{owner} loss_scale[{key!r}] must be a positive number, got {value!r}')
        if loss_scale.get('growth_interval', 1) != int(loss_scale.get('growth_interval', 1)):
            raise ConfigError(f"{owner} loss_scale['growth_interval'] must be an int, "
                              f"got {loss_scale['growth_interval']!r}")
        return dict(loss_scale)
    raise ConfigError(f"{owner} loss_scale must be 'dynamic', a positive number or a dict with keys "
                      f'{list(SCALER_KEYS)}, got {loss_scale!r}')


def build_grad_scaler(loss_scale, device):
    """A ``torch.amp.GradScaler`` for ``device`` from a normalised ``loss_scale``
    (see :func:`check_loss_scale`). A static scale is the scaler's initial scale; the
    caller keeps it fixed with ``scaler.update(new_scale=...)`` after every step."""
    device_type = torch.device(device).type
    if isinstance(loss_scale, float):
        return torch.amp.GradScaler(device_type, init_scale=loss_scale)
    kwargs = dict(loss_scale)
    if 'growth_interval' in kwargs:
        kwargs['growth_interval'] = int(kwargs['growth_interval'])
    return torch.amp.GradScaler(device_type, **kwargs)


def scale_tensor(scaler):
    """The scaler's current scale as a device tensor copy, without a host sync (for meters)."""
    get_async = getattr(scaler, '_get_scale_async', None)
    scale = get_async() if get_async is not None else None
    if scale is None:  # not used yet, or a torch without the async getter
        return torch.tensor(scaler.get_scale())
    return scale.detach().clone()  # the scaler updates its tensor in place


def autocast_factory(device, precision):
    """A zero-arg callable returning the autocast context for ``precision`` on ``device``."""
    dtype = PRECISIONS[precision]
    device_type = torch.device(device).type
    return functools.partial(torch.autocast, device_type, dtype=dtype)


def mmcv_fp16_modules(model):
    """The submodules that declare an ``fp16_enabled`` attribute (MMCV-style models)."""
    return [module for module in model.modules() if hasattr(module, 'fp16_enabled')]


def enable_fp16(model):
    """Turn on MMCV's ``fp16_enabled`` switch of every submodule of ``model`` that declares one
    (MMCV's ``wrap_fp16_model`` semantics: the weights stay float32; ``auto_fp16`` methods then
    run under fp16 autocast). Returns those modules (empty: a plain model, autocast instead)."""
    modules = mmcv_fp16_modules(model)
    for module in modules:
        module.fp16_enabled = True
    return modules


def cast_tensor_type(value, src_type, dst_type):
    """``value`` with every floating tensor of dtype ``src_type`` cast to ``dst_type``
    (dicts, lists and tuples are walked; anything else is returned as is)."""
    if isinstance(value, torch.Tensor):
        return value.to(dst_type) if value.dtype == src_type else value
    if isinstance(value, Mapping):
        return type(value)({k: cast_tensor_type(v, src_type, dst_type) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, '_fields'):
        return type(value)(*(cast_tensor_type(v, src_type, dst_type) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_tensor_type(v, src_type, dst_type) for v in value)
    return value


def _device_type(module, bound):
    for value in bound.arguments.values():
        if isinstance(value, torch.Tensor):
            return value.device.type
    for parameter in module.parameters():
        return parameter.device.type
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def _cast_arguments(fn, apply_to, src_type, dst_type, decorator):
    signature = inspect.signature(fn)
    names = list(signature.parameters)
    if apply_to is not None:
        unknown = [name for name in apply_to if name not in names]
        if unknown:
            raise ConfigError(f'{decorator}(apply_to={list(apply_to)}) on {fn.__qualname__}: no argument named '
                              f'{unknown}; its arguments are {names[1:]}')

    def cast(args, kwargs):
        bound = signature.bind(*args, **kwargs)
        for name in names[1:] if apply_to is None else apply_to:
            if name in bound.arguments:
                bound.arguments[name] = cast_tensor_type(bound.arguments[name], src_type, dst_type)
        return bound
    return cast


def _when_fp16_enabled(apply_to, name, source, target, autocast_kwargs, cast_output_to):
    """A method decorator active only when ``self.fp16_enabled``: cast ``source`` tensor
    arguments to ``target``, run under ``torch.autocast(**autocast_kwargs)``, and cast
    ``target`` outputs to ``cast_output_to`` when given."""
    def decorator(fn):
        cast = _cast_arguments(fn, apply_to, source, target, name)

        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            if not isinstance(self, torch.nn.Module):  # as MMCV's decorators
                raise TypeError(f'@{name} can only be used to decorate the method of an nn.Module; '
                                f'{fn.__qualname__} was called on a {type(self).__name__}')
            if not getattr(self, 'fp16_enabled', False):
                return fn(self, *args, **kwargs)
            bound = cast((self,) + args, kwargs)
            with torch.autocast(_device_type(self, bound), **autocast_kwargs):
                output = fn(*bound.args, **bound.kwargs)
            return output if cast_output_to is None else cast_tensor_type(output, target, cast_output_to)
        return wrapper
    return decorator


def auto_fp16(apply_to=None, out_fp32=False):
    """Decorate a module method to run it in fp16 autocast when ``self.fp16_enabled`` is True.

    ``apply_to``: the argument names whose float32 tensors are cast to float16 (default: all
    arguments); ``out_fp32``: cast float16 outputs back to float32. When ``fp16_enabled`` is
    False (the default) the method runs unchanged.
    """
    return _when_fp16_enabled(apply_to, 'auto_fp16', torch.float32, torch.float16, dict(dtype=torch.float16),
                              torch.float32 if out_fp32 else None)


def force_fp32(apply_to=None, out_fp16=False):
    """Decorate a module method to run it in float32 when ``self.fp16_enabled`` is True.

    ``apply_to``: the argument names whose float16 tensors are cast to float32 (default: all
    arguments); autocast is disabled inside the method (losses, box decoding, ...).
    ``out_fp16``: cast float32 outputs to float16.
    """
    return _when_fp16_enabled(apply_to, 'force_fp32', torch.float16, torch.float32, dict(enabled=False),
                              torch.float16 if out_fp16 else None)


__all__ = ['PRECISIONS', 'check_precision', 'check_loss_scale', 'build_grad_scaler', 'scale_tensor',
           'autocast_factory', 'mmcv_fp16_modules', 'enable_fp16', 'cast_tensor_type', 'auto_fp16', 'force_fp32']
