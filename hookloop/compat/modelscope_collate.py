"""ModelScope's default data collator: how its trainer batches rows when no ``data_collator``
is given, and so how the loaders of a run built from a ModelScope configuration batch them.

Rows that are dicts become one dict:

* ``label`` (one number per row: an int, a float, a one-element tensor or array) becomes
  ``labels``, an int64 tensor for integer labels and a float32 one otherwise; ``label_ids``
  (a sequence per row) becomes ``labels`` too. The model's ``forward(..., labels)`` gets them.
* every other key is stacked along a new first dimension — tensors with ``torch.stack``, a list
  of tensors per row as all of them stacked, anything else through ``numpy.array`` — except the
  keys whose value (in the first row) is ``None`` or a string, which are left out.

Rows that are tuples become a list with one stacked entry per position; other rows (tensors,
numbers) one stacked tensor.
"""
from collections.abc import Mapping

import numpy as np
import torch


def _as_array(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _stack(values):
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values)
    if isinstance(first, list) and first and isinstance(first[0], torch.Tensor):
        return torch.stack([tensor for value in values for tensor in value])
    return torch.as_tensor(np.array([_as_array(value) for value in values]))


def _labels(values):
    first = _as_array(values[0])
    integer = np.issubdtype(first.dtype, np.integer) or np.issubdtype(first.dtype, np.bool_)
    return torch.as_tensor(np.array([_as_array(value) for value in values]),
                           dtype=torch.long if integer else torch.float32)


def modelscope_collate(rows):
    """A batch of ``rows`` as ModelScope's default collator makes it (see the module docstring)."""
    first = rows[0]
    if isinstance(first, Mapping):
        batch = {}
        if first.get('label') is not None:
            batch['labels'] = _labels([row['label'] for row in rows])
        elif first.get('label_ids') is not None:
            batch['labels'] = _labels([row['label_ids'] for row in rows])
        for key, value in first.items():
            if key in ('label', 'label_ids') or value is None or isinstance(value, str):
                continue
            batch[key] = _stack([row[key] for row in rows])
        return batch
    if isinstance(first, tuple):
        return [_stack([row[index] for row in rows]) for index in range(len(first))]
    return _stack(list(rows))


__all__ = ['modelscope_collate']
