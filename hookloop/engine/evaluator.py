"""Evaluators: objects with ``reset()``, ``update(outputs, batch)`` and ``compute() -> dict``.

The trainer calls ``update`` with the model's outputs and the batch at every
validation iteration and ``compute`` once at the end. Counts stay on the device
until ``compute``. A ``torchmetrics.Metric`` is accepted as is (wrapped by
:class:`TorchMetricEvaluator`), so its cross-rank syncing is reused.

In a distributed run each rank updates with its own share of the val set (the
trainer drops the padding copies first, see :func:`take_first`); ``compute`` of the
built-in evaluators sums their counts over ranks, so every rank returns the metric
of the whole val set.
"""
import math
import sys
from collections.abc import Mapping

import torch

from ..data.resumable import ResumableBatchSampler
from ..dist.process_group import all_gather_objects, all_reduce_numbers
from ..errors import ConfigError
from ..registry import METRICS


def select(container, key, what):
    """``container[key]`` for the prediction or target, with a clear error when absent."""
    if key is None:
        return container
    try:
        return container[key]
    except (KeyError, IndexError, TypeError):
        keys = list(container.keys()) if isinstance(container, Mapping) else f'{type(container).__name__}'
        raise ConfigError(f'evaluator cannot find the {what} at key {key!r} in {keys}') from None


def predictions(outputs, pred_key):
    if isinstance(outputs, torch.Tensor):
        return outputs
    if pred_key is None and hasattr(outputs, 'logits'):
        return outputs.logits
    return select(outputs, pred_key or 'logits', 'prediction')


@METRICS.register_module()
class Accuracy:
    """Top-k classification accuracy in percent, reported as ``accuracy``.

    Args:
        pred_key: key of the logits in the model outputs (a plain tensor output is used as is).
        target_key: key (dict batch) or position (tuple batch, default the last) of the labels.
        topk: count a sample as right when its label is among the ``topk`` best scores.
    """

    def __init__(self, pred_key='logits', target_key=-1, topk=1, name='accuracy'):
        if not isinstance(topk, int) or topk < 1:
            raise ConfigError(f'Accuracy topk must be a positive int, got {topk!r}')
        self.pred_key, self.target_key, self.topk, self.name = pred_key, target_key, topk, name
        self.reset()

    def reset(self):
        self.correct = None
        self.total = 0

    def update(self, outputs, batch):
        logits = predictions(outputs, self.pred_key)
        target = select(batch, self.target_key, 'target')
        best = logits.topk(self.topk, dim=-1).indices
        hits = (best == target.unsqueeze(-1)).any(dim=-1).sum()
        self.correct = hits if self.correct is None else self.correct + hits
        self.total += target.numel()

    def compute(self):
        correct = self.correct.item() if self.correct is not None else 0
        correct, total = all_reduce_numbers([correct, self.total])  # whole val set, all ranks
        if not total:
            return {self.name: float('nan')}
        return {self.name: 100.0 * correct / total}


class TorchMetricEvaluator:
    """Feeds a ``torchmetrics.Metric`` with ``(prediction, target)`` from outputs and batch."""

    def __init__(self, metric, pred_key=None, target_key=-1, name=None):
        self.metric = metric
        self.pred_key, self.target_key = pred_key, target_key
        self.name = name or type(metric).__name__.lower()

    def reset(self):
        self.metric.reset()

    def update(self, outputs, batch):
        self.metric.update(predictions(outputs, self.pred_key), select(batch, self.target_key, 'target'))

    def compute(self):
        value = self.metric.compute()
        if isinstance(value, Mapping):
            return {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in value.items()}
        return {self.name: value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value}


class FunctionEvaluator:
    """A plain ``fn(outputs, batch) -> dict`` evaluated per batch; metrics are the
    sample-weighted means of the per-batch values."""

    def __init__(self, fn):
        self.fn = fn
        self.reset()

    def reset(self):
        self.sums, self.count = {}, 0

    def update(self, outputs, batch):
        values = self.fn(outputs, batch)
        if not isinstance(values, Mapping):
            raise ConfigError(f'evaluator function {self.fn!r} must return a dict of metrics, '
                              f'got {type(values).__name__}')
        size = _batch_size(batch)
        for key, value in values.items():
            value = value.detach() if isinstance(value, torch.Tensor) else value
            self.sums[key] = self.sums.get(key, 0) + value * size
        self.count += size

    def compute(self):
        local = {k: float(v) if not isinstance(v, torch.Tensor) else v.item() for k, v in self.sums.items()}
        sums, count = {}, 0
        for rank_sums, rank_count in all_gather_objects((local, self.count)):  # one collective
            for key, value in rank_sums.items():
                sums[key] = sums.get(key, 0.0) + value
            count += rank_count
        return {k: v / max(count, 1) for k, v in sums.items()}


def real_samples(loader):
    """How many of ``loader``'s samples on this rank are real (not wrap-around padding
    added to give every rank the same count); ``None`` when nothing is padded."""
    sampler = getattr(loader, 'batch_sampler', None)
    if not isinstance(sampler, ResumableBatchSampler) or sampler.world_size == 1 or sampler.shard_drop_last:
        return None
    # Rank r holds positions r, r + W, ... of the padded order; those >= length are padding.
    return max(0, math.ceil((sampler.length - sampler.rank) / sampler.world_size))


def take_first(outputs, batch, remaining):
    """``(outputs, batch, remaining)`` cut to the first ``remaining`` samples of the batch:
    every tensor whose first dimension is the batch size is sliced, and so is every list or
    tuple of per-sample values (names, ids, prompts) of the batch size inside a dict. A batch
    or outputs that are themselves a tuple/list hold fields (``(inputs, targets)``): each
    field is cut. ``(None, None, 0)`` when nothing is left."""
    size = _batch_size(batch)
    if remaining >= size:
        return outputs, batch, remaining - size
    if remaining <= 0:
        return None, None, 0
    return _slice(outputs, remaining, size, fields=True), _slice(batch, remaining, size, fields=True), 0


def _slice(value, n, size, fields=False):
    """``value`` cut to its first ``n`` samples; ``fields``: a top-level tuple/list is a
    container of fields, not a list of samples."""
    if isinstance(value, torch.Tensor):
        return value[:n] if value.dim() > 0 and value.shape[0] == size else value
    if isinstance(value, Mapping):
        items = {k: _slice(v, n, size) for k, v in value.items()}
        try:
            return type(value)(**items) if type(value) is not dict else items
        except TypeError:  # a Mapping type that cannot be built from keywords
            return items
    if isinstance(value, tuple) and hasattr(value, '_fields'):  # namedtuple
        return type(value)(*(_slice(v, n, size) for v in value))
    if isinstance(value, (list, tuple)):
        if not fields and len(value) == size:  # one entry per sample
            return type(value)(value[:n])
        return type(value)(_slice(v, n, size) for v in value)
    return value


def _batch_size(batch):
    if isinstance(batch, torch.Tensor):
        return len(batch)
    items = batch.values() if isinstance(batch, Mapping) else batch
    for item in items:
        if isinstance(item, torch.Tensor) and item.dim() > 0:
            return len(item)
    return 1


def build_evaluator(evaluator):
    """An evaluator from an object, a torchmetrics Metric, a function or a config dict."""
    if evaluator is None:
        return None
    if isinstance(evaluator, Mapping):
        return build_evaluator(METRICS.build(evaluator))
    if all(hasattr(evaluator, m) for m in ('reset', 'update', 'compute')):
        # A torchmetrics Metric can only exist if torchmetrics is imported: never import it here.
        torchmetrics = sys.modules.get('torchmetrics')
        if torchmetrics is not None and isinstance(evaluator, torchmetrics.Metric):
            return TorchMetricEvaluator(evaluator)
        return evaluator
    if callable(evaluator):
        return FunctionEvaluator(evaluator)
    raise ConfigError(f'val_evaluator must be a metric dict, an object with reset/update/compute '
                      f'or a function, got {type(evaluator).__name__}')
