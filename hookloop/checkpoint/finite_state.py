"""No checkpoint with non-finite state: the check a checkpoint passes before it is written.

``check_finite_state(checkpoint)`` looks at everything of a checkpoint that training
computed: the model weights (``state_dict``), the optimizer state, the EMA averages
(``ema_state_dict``) and the hooks' states (the GradScaler's scale and the accumulated
gradients of ``OptimizerHook``, EMA's averages, ...). Meta data, RNG and data positions are
not numbers training computed and are not looked at.

Cost: one fused reduction (``torch._foreach_norm``, the 2-norm of every tensor accumulated
in float32: a NaN or inf anywhere makes it non-finite) and ONE host sync per save; nothing
per step. Only when that says "not finite" are the tensors walked one by one: to name the
culprits in the error, and to tell a real NaN/inf from a 2-norm that merely overflowed
float32 (values above ~1e19), which is finite state and passes. (The 2-norm is the fast
fused kernel; ``ord=inf`` and ``isfinite`` per tensor measured 35x and 100x slower on CPU.)

``Trainer.write_checkpoint`` calls it for every save (interval, last, best, sync or async,
whichever invalid-loss hook is registered), before anything is written or deleted, so a
non-finite state stops the run with one ``InvalidLossError`` and ``last_checkpoint`` and
the best file stay on the newest finite ones.
"""
import math
from collections.abc import Mapping

import torch

from ..errors import InvalidLossError

CHECKED = ('state_dict', 'optimizer', 'ema_state_dict', 'hooks')
_SHOWN = 5


def _leaves(value, path, scaled_grads=False):
    """``(path, value)`` of every floating tensor and Python float inside ``value``; with
    ``scaled_grads`` not the accumulated gradients of a hook's state (``hooks.<name>.grads``)."""
    if scaled_grads and len(path) == 3 and path[0] == 'hooks' and path[2] == 'grads':
        return
    if isinstance(value, torch.Tensor):
        if hasattr(value, 'to_local'):  # a DTensor: this rank's shard
            value = value.to_local()
        if value.is_floating_point() or value.is_complex():
            yield path, value
    elif isinstance(value, float):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, path + (str(key),), scaled_grads)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves(item, path + (str(index),), scaled_grads)


def _describe(path):
    top, rest = path[0], '.'.join(path[1:])
    where = {'state_dict': 'model weight', 'optimizer': 'optimizer state', 'ema_state_dict': 'EMA average',
             'hooks': 'hook state'}[top]
    return f'{where} {rest}' if rest else where


def non_finite_entries(checkpoint, keys=CHECKED, scaled_grads=False):
    """The places (``'model weight fc.weight'``...) of ``checkpoint`` holding NaN or inf.
    Walks every tensor: for the error message, after :func:`is_finite` said no."""
    bad = []
    for key in keys:
        if key not in checkpoint:
            continue
        for path, value in _leaves(checkpoint[key], (key,), scaled_grads):
            finite = math.isfinite(value) if isinstance(value, float) else bool(torch.isfinite(value).all())
            if not finite:
                bad.append(_describe(path))
    return bad


def is_finite(checkpoint, keys=CHECKED, process_group=None, scaled_grads=False):
    """True when every floating tensor and float of ``checkpoint[keys]`` is finite: one fused
    reduction per device and dtype, one host sync (and, across ranks, one all-reduce)."""
    tensors, floats_ok = [], True
    for key in keys:
        if key in checkpoint:
            for _, value in _leaves(checkpoint[key], (key,), scaled_grads):
                if isinstance(value, float):
                    floats_ok = floats_ok and math.isfinite(value)
                elif value.numel():
                    tensors.append(torch.view_as_real(value) if value.is_complex() else value)
    norms = [n.reshape(1) for n in torch._foreach_norm(tensors, 2, dtype=torch.float32)] if tensors else []
    by_device = {}
    for n in norms:
        by_device.setdefault(n.device, []).append(n)
    verdicts = [torch.isfinite(torch.cat(group)).all() for group in by_device.values()]
    finite = floats_ok and all(bool(v) for v in verdicts)  # the one sync (per device)
    if floats_ok and not finite:  # a NaN/inf, or only a 2-norm above the float32 range?
        finite = not non_finite_entries(checkpoint, keys, scaled_grads)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size(process_group) > 1:
        flag = torch.tensor([0 if finite else 1], dtype=torch.int32)
        if torch.distributed.get_backend(process_group) == 'nccl':
            flag = flag.cuda()
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=process_group)
        finite = int(flag.item()) == 0
    return finite


def check_finite_state(checkpoint, path, scaled_grads=False):
    """Raise ``InvalidLossError`` (one line) when the state ``checkpoint`` would save is not
    finite. Nothing has been written or deleted yet when it raises.

    ``scaled_grads`` (fp16 loss scaling): the gradients accumulated so far in a window are
    not looked at: an overflow among them is the GradScaler's business (it skips that
    window's step), and a resume from the checkpoint skips it the same way."""
    if is_finite(checkpoint, scaled_grads=scaled_grads):
        return
    bad = non_finite_entries(checkpoint, scaled_grads=scaled_grads)
    meta = checkpoint.get('meta', {}) if isinstance(checkpoint.get('meta'), Mapping) else {}
    when = f' after {meta["iter"]} iterations' if 'iter' in meta else ''
    shown = ', '.join(bad[:_SHOWN]) + (f' and {len(bad) - _SHOWN} more' if len(bad) > _SHOWN else '')
    if not bad:
        shown = 'the state of another rank'
    raise InvalidLossError(
        f'not saving {path}: the training state is not finite{when} (NaN/inf in {shown}); training stopped, '
        'nothing was written or deleted, last_checkpoint still names the newest finite checkpoint')


__all__ = ['check_finite_state', 'is_finite', 'non_finite_entries']
