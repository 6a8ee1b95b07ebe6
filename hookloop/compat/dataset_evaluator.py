"""MMCV's evaluation contract: the dataset evaluates the model's outputs.

MMCV's ``EvalHook`` runs ``model(return_loss=False, **data)`` over the val loader, collects
one result per sample and calls ``dataset.evaluate(results, logger=..., **eval_kwargs)``
(``metric='bbox'``, ``metric='mIoU'``, ...). :class:`DatasetEvaluator` does the same as a
hookloop evaluator, so ``evaluation=dict(interval=1, metric='accuracy')`` works unchanged.
"""
import logging
from collections.abc import Mapping

import torch

from ..dist.process_group import all_gather_objects, get_world_size
from ..errors import ConfigError


class SampleResults:
    """The per-sample results of a test loop, as MMCV's ``single_gpu_test`` collects them."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.results = []

    def update(self, outputs, batch):
        if isinstance(outputs, torch.Tensor):
            self.results.extend(outputs.detach().cpu())
        elif isinstance(outputs, (list, tuple)):
            self.results.extend(outputs)
        else:  # one result for the whole batch (batch size 1, as most MMCV test loaders use)
            self.results.append(outputs)

    def gathered(self):
        """The results of every rank, in sample order."""
        results = self.results
        if get_world_size() > 1:  # rank r holds samples r, r + W, ...: interleave them back into order
            per_rank = all_gather_objects(results)
            results = [part[i] for i in range(max(map(len, per_rank))) for part in per_rank if i < len(part)]
        return results


class DatasetEvaluator(SampleResults):
    """Collects per-sample results and lets ``dataset.evaluate`` compute the metrics.

    Args:
        dataset: the val dataset; it must have ``evaluate(results, **eval_kwargs)``.
        eval_kwargs: passed to ``dataset.evaluate`` (``metric=...`` and the dataset's own options).
    """

    wants_test_outputs = True  # the model is called with return_loss=False, not val_step

    def __init__(self, dataset, **eval_kwargs):
        if not callable(getattr(dataset, 'evaluate', None)):
            raise ConfigError(f'evaluation has {sorted(eval_kwargs)} for the dataset, but {type(dataset).__name__} has '
                              'no evaluate(results, metric=...) method to take them')
        self.dataset, self.eval_kwargs = dataset, eval_kwargs
        super().__init__()

    def compute(self):
        return self.evaluate(self.gathered())

    def evaluate(self, results, logger=None):
        metrics = self.dataset.evaluate(results, logger=logger or logging.getLogger('hookloop.evaluate'),
                                        **self.eval_kwargs)
        if not isinstance(metrics, Mapping):
            raise ConfigError(f'{type(self.dataset).__name__}.evaluate returned {type(metrics).__name__}, not a dict')
        return dict(metrics)
