"""Moving batches to a device: every tensor inside dicts, lists, tuples and namedtuples."""
from collections.abc import Mapping

import torch


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
