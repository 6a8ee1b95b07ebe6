"""The model step contract: how a batch reaches the model and what comes back."""
from collections.abc import Mapping

import torch

from .errors import ConfigError


def map_tensors(value, fn):
    """``value`` with ``fn`` applied to every tensor in it (dicts, lists and tuples are walked)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        items = {k: map_tensors(v, fn) for k, v in value.items()}
        return items if type(value) is dict else type(value)(items)
    if isinstance(value, tuple) and hasattr(value, '_fields'):  # namedtuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def move_to_device(batch, device):
    """``batch`` with every tensor on ``device``."""
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))


def detach_outputs(outputs):
    """A step's outputs (a Mapping) as a plain dict of detached values: holding it keeps no
    autograd graph (and none of the activations it saved) alive."""
    return {key: map_tensors(value, torch.Tensor.detach) for key, value in outputs.items()}


def call_model(model, batch):
    """A Mapping batch is passed as keywords, a tuple/list as positional arguments,
    anything else as the single argument."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def as_outputs(outputs):
    """Model outputs as a Mapping: a tensor is ``{'loss': tensor}``; a Mapping (an HF
    ``ModelOutput`` too) is used as is; another object with ``.loss`` contributes its
    public attributes."""
    if isinstance(outputs, torch.Tensor):
        return {'loss': outputs}
    if isinstance(outputs, Mapping):
        return outputs
    if hasattr(outputs, 'loss'):
        fields = {k: v for k, v in vars(outputs).items() if not k.startswith('_')} if hasattr(outputs, '__dict__') else {}
        fields['loss'] = outputs.loss
        return fields
    raise ConfigError(f'the model (or loss_fn) returned a {type(outputs).__name__}; a training step must return '
                    'a loss tensor, a dict with a "loss" entry, or an object with a .loss attribute '
                    '(pass loss_fn=... to turn plain outputs into a loss)')


def check_losses(outputs, iteration):
    """Every ``loss*`` output must be a one-element tensor (or a plain number, logged only).
    Shape and type only: no device sync."""
    for key, value in outputs.items():
        if not (isinstance(key, str) and key.startswith('loss')):
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ConfigError(f'the model output {key!r} at iteration {iteration} is a tensor of shape '
                                  f'{tuple(value.shape)}, not a scalar; reduce it (e.g. .mean()) in the model '
                                  'or loss_fn')
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f'the model output {key!r} at iteration {iteration} is a {type(value).__name__}, '
                              'not a scalar tensor')
