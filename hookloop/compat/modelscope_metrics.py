"""ModelScope's metrics as hookloop evaluators.

ModelScope builds a fresh metric object for every evaluation and calls ``add(outputs,
inputs)`` per batch and ``evaluate() -> dict`` at the end. :class:`MetricAdapter` gives such
an object (a class registered in hookloop's ``METRICS``, or an instance) hookloop's
``reset / update / compute``. The standard names below are computed by small evaluators of
their own, with ModelScope's result keys and scales (fractions, not percent):

* ``accuracy``: predicted labels (``outputs['labels']`` / ``outputs['label']``, else the
  arg-max of ``outputs['logits']``) against ``inputs['labels']`` (or ``'label'``) ->
  ``{'accuracy': fraction}``;
* ``seq-cls-metric``: arg-max of ``outputs['logits']`` against ``inputs['labels']`` ->
  ``{'accuracy': fraction}``;
* ``precision``, ``recall``, ``f1``: macro averages over the classes seen, from the logits'
  arg-max -> ``{'precision': ...}`` / ``{'recall': ...}`` / ``{'f1': ...}``;
* ``loss-metric``: the mean of ``outputs['loss']`` over batches -> ``{'loss': ...}``.

Counts stay on the device until ``compute`` and are summed over ranks there.
"""
import copy
from collections.abc import Mapping

import torch

from ..dist.process_group import all_reduce_numbers
from ..errors import ConfigError
from ..engine.evaluator import build_evaluator
from ..registry import METRICS


def _pick(container, keys, what):
    if isinstance(container, Mapping):
        for key in keys:
            if key in container and container[key] is not None:
                return container[key]
        raise ConfigError(f'ModelScope metric: no {what} under {list(keys)} in {sorted(container)}')
    if hasattr(container, keys[0]):
        return getattr(container, keys[0])
    raise ConfigError(f'ModelScope metric: the {what} must come in a dict with {list(keys)}, '
                      f'got {type(container).__name__}')


def _targets(inputs):
    return _pick(inputs, ('labels', 'label'), 'labels')


def _argmax(outputs):
    logits = outputs if isinstance(outputs, torch.Tensor) else _pick(outputs, ('logits',), 'logits')
    return logits.argmax(dim=-1)


class _Counts:
    """Device-side sums, read once at ``compute`` (one all-reduce over ranks)."""

    def reset(self):
        self.sums = None

    def _add(self, *values):
        values = torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()) for v in values])
        self.sums = values if self.sums is None else self.sums + values.to(self.sums.device)

    def _totals(self, size):
        local = self.sums.tolist() if self.sums is not None else [0.0] * size
        return all_reduce_numbers(local)


class LabelAccuracy(_Counts):
    """``accuracy`` (``seq-cls-metric`` with ``from_logits``) as a fraction."""

    def __init__(self, from_logits=False):
        self.from_logits = from_logits
        self.reset()

    def update(self, outputs, batch):
        target = _targets(batch)
        if self.from_logits or not (isinstance(outputs, Mapping) and ('labels' in outputs or 'label' in outputs)):
            predicted = _argmax(outputs)
        else:
            predicted = _pick(outputs, ('labels', 'label'), 'predicted labels')
        predicted = torch.as_tensor(predicted).reshape(-1)
        target = torch.as_tensor(target).reshape(-1).to(predicted.device)
        self._add((predicted == target).sum(), target.numel())

    def compute(self):
        correct, total = self._totals(2)
        return {'accuracy': correct / total if total else float('nan')}


class MacroScore:
    """Macro precision / recall / F1 over the classes seen in targets or predictions."""

    def __init__(self, name):
        if name not in ('precision', 'recall', 'f1'):
            raise ConfigError(f'MacroScore name must be precision, recall or f1, got {name!r}')
        self.name = name
        self.reset()

    def reset(self):
        self.predicted, self.target = [], []

    def update(self, outputs, batch):
        self.predicted.append(_argmax(outputs).reshape(-1).detach())
        self.target.append(torch.as_tensor(_targets(batch)).reshape(-1).detach())

    def compute(self):
        from ..dist.process_group import all_gather_objects
        predicted = torch.cat(self.predicted).cpu() if self.predicted else torch.zeros(0, dtype=torch.long)
        target = torch.cat(self.target).cpu() if self.target else torch.zeros(0, dtype=torch.long)
        pairs = all_gather_objects((predicted.tolist(), target.tolist()))
        predicted = torch.tensor([p for part, _ in pairs for p in part], dtype=torch.long)
        target = torch.tensor([t for _, part in pairs for t in part], dtype=torch.long)
        classes = torch.unique(torch.cat([predicted, target]))
        if not len(classes):
            return {self.name: float('nan')}
        scores = []
        for c in classes:
            tp = ((predicted == c) & (target == c)).sum().item()
            fp = ((predicted == c) & (target != c)).sum().item()
            fn = ((predicted != c) & (target == c)).sum().item()
            precision = tp / (tp + fp) if tp + fp else 0.0
            recall = tp / (tp + fn) if tp + fn else 0.0
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            scores.append({'precision': precision, 'recall': recall, 'f1': f1}[self.name])
        return {self.name: sum(scores) / len(scores)}


class MeanLoss(_Counts):
    """``loss-metric``: the mean of ``outputs[loss_key]`` over the validation batches."""

    def __init__(self, loss_key='loss'):
        self.loss_key = loss_key
        self.reset()

    def update(self, outputs, batch):
        self._add(_pick(outputs, (self.loss_key,), 'loss').detach().float().mean(), 1)

    def compute(self):
        total, count = self._totals(2)
        return {'loss': total / count if count else float('nan')}


class MetricAdapter:
    """A ModelScope-style metric (``add(outputs, inputs)``, ``evaluate()``) as an evaluator:
    ``reset`` makes a fresh one, as ModelScope builds one per evaluation."""

    def __init__(self, factory):
        self.factory = factory
        self.metric = None

    def reset(self):
        self.metric = self.factory()

    def update(self, outputs, batch):
        if self.metric is None:
            self.reset()
        self.metric.add(outputs, batch)

    def compute(self):
        if self.metric is None:
            self.reset()
        values = self.metric.evaluate()
        if not isinstance(values, Mapping):
            raise ConfigError(f'{type(self.metric).__name__}.evaluate() must return a dict, '
                              f'got {type(values).__name__}')
        return dict(values)


STANDARD = {
    'accuracy': lambda: LabelAccuracy(),
    'seq-cls-metric': lambda: LabelAccuracy(from_logits=True),
    'precision': lambda: MacroScore('precision'),
    'recall': lambda: MacroScore('recall'),
    'f1': lambda: MacroScore('f1'),
    'loss-metric': lambda: MeanLoss(),
}


# ModelScope's ``task_default_metrics`` (used when ``evaluation.metrics`` is absent), for the
# tasks whose metric is among the standard names above.
TASK_METRICS = {task: ['seq-cls-metric'] for task in ('text-classification', 'sentence-similarity', 'nli',
                                                     'sentiment-classification')}
TASK_METRICS.update({task: ['accuracy'] for task in ('image-captioning', 'visual-question-answering')})
# hookloop's choice where ModelScope names none: the mean denoising loss of the eval set
TASK_METRICS['text-to-image-synthesis'] = ['loss-metric']


def is_modelscope_metric(obj):
    return hasattr(obj, 'add') and hasattr(obj, 'evaluate') and not hasattr(obj, 'update')


def metric(spec):
    """An evaluator from a ModelScope metric name, a ``{type: ...}`` dict or a metric object."""
    if isinstance(spec, str) and spec in STANDARD:
        return STANDARD[spec]()
    if isinstance(spec, Mapping):
        spec = dict(spec)
        kind = spec.get('type')
        if isinstance(kind, str) and kind in STANDARD and kind not in METRICS:
            if len(spec) > 1:
                raise ConfigError(f'ModelScope metric {kind!r} takes no arguments here, got {sorted(spec)}')
            return STANDARD[kind]()
        if isinstance(kind, str) and kind in METRICS:
            cls = METRICS.get(kind)
            args = {k: v for k, v in spec.items() if k != 'type'}
            if isinstance(cls, type) and is_modelscope_metric(cls):
                return MetricAdapter(lambda: METRICS.build(dict(type=kind, **args)))
        return build_evaluator(spec)
    if isinstance(spec, str):
        if spec in METRICS:
            cls = METRICS.get(spec)
            if isinstance(cls, type) and is_modelscope_metric(cls):
                return MetricAdapter(lambda: METRICS.build(dict(type=spec)))
            return build_evaluator(dict(type=spec))
        raise ConfigError(f'ModelScope evaluation metric {spec!r} is not known: the standard names are '
                          f'{", ".join(STANDARD)}; others must be registered in hookloop METRICS '
                          f'(registered: {", ".join(METRICS.keys())})')
    if isinstance(spec, type) and is_modelscope_metric(spec):
        return MetricAdapter(spec)
    if is_modelscope_metric(spec):
        return MetricAdapter(lambda: copy.deepcopy(spec))  # a fresh copy of the given one each time
    return build_evaluator(spec)
