"""The optimizer step's options, checked without a trainer: the summed loss, ``cumulative_iters``,
``grad_clip``; and the parameters an optimizer steps. ``OptimizerHook`` and its processor use them."""
import math
from collections.abc import Mapping

from ..errors import ConfigError


def total_loss(outputs, loss_keys):
    """The sum of ``outputs[k]`` for ``k`` in ``loss_keys``; ConfigError naming the keys found."""
    try:
        losses = [outputs[key] for key in loss_keys]
    except KeyError as exc:
        raise ConfigError(f'loss key {exc.args[0]!r} is not in the model outputs {list(outputs.keys())}; '
                          'set loss_keys to the keys to back-propagate') from None
    loss = losses[0]
    for extra in losses[1:]:
        loss = loss + extra
    return loss


def check_cumulative_iters(value, owner='OptimizerHook'):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'{owner} cumulative_iters must be a positive int, got {value!r}')
    return value


def _positive_number(value):
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def check_grad_clip(grad_clip, owner='OptimizerHook'):
    """Normalise ``grad_clip``: None; ``dict(max_norm, norm_type=2, error_if_nonfinite=False)``
    for ``clip_grad_norm_`` (``norm_type`` a positive number, ``inf`` or ``'inf'``); or
    ``dict(clip_value=v)`` for ``clip_grad_value_``."""
    if grad_clip is None:
        return None
    if not isinstance(grad_clip, Mapping):
        raise ConfigError(f'{owner} grad_clip must be None or a dict like dict(max_norm=1.0, norm_type=2) '
                          f'or dict(clip_value=0.5), got {grad_clip!r}')
    grad_clip = dict(grad_clip)
    if 'clip_value' in grad_clip:
        if set(grad_clip) != {'clip_value'}:
            raise ConfigError(f'{owner} grad_clip: clip_value (value clipping) takes no other keys, '
                              f'got {sorted(grad_clip)}')
        if not _positive_number(grad_clip['clip_value']):
            raise ConfigError(f'{owner} grad_clip clip_value must be a positive number, '
                              f"got {grad_clip['clip_value']!r}")
        return grad_clip
    unknown = sorted(set(grad_clip) - {'max_norm', 'norm_type', 'error_if_nonfinite'})
    if unknown:
        raise ConfigError(f'{owner} grad_clip got unknown keys {unknown}; use max_norm, norm_type '
                          '(and error_if_nonfinite), or clip_value alone')
    if 'max_norm' not in grad_clip or not _positive_number(grad_clip['max_norm']):
        raise ConfigError(f"{owner} grad_clip needs max_norm, a positive number, got {grad_clip.get('max_norm')!r}")
    norm_type = grad_clip.get('norm_type', 2)
    if isinstance(norm_type, str) and norm_type.lower() == 'inf':
        norm_type = math.inf
    if not _positive_number(norm_type):
        raise ConfigError(f"{owner} grad_clip norm_type must be a positive number or 'inf', got {norm_type!r}")
    grad_clip['norm_type'] = float(norm_type)
    return grad_clip


def optimized_params(optimizer):
    """Every parameter the optimizer steps, group by group."""
    return [p for group in optimizer.param_groups for p in group['params']]
