"""``mmcv.engine``: MMCV's test loops, ``single_gpu_test`` and ``multi_gpu_test``.

Both call ``model(return_loss=False, **data)`` over the loader under ``torch.no_grad()``
and collect one result per sample, as MMCV's do; ``multi_gpu_test`` gathers the results of
every rank (in sample order, on every rank; MMCV returns them on rank 0). This is what
``EvalHook`` and the trainer's ``DatasetEvaluator`` compute during training.
"""
import torch

from ..dataset_evaluator import SampleResults
from ...data.device import move_to_device


def _run(model, data_loader):
    collected = SampleResults()
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device('cpu'))
    with torch.no_grad():
        for data in data_loader:
            data = move_to_device(data, device)
            outputs = model(return_loss=False, **data) if isinstance(data, dict) else model(data, return_loss=False)
            collected.update(outputs, data)
    return collected


def single_gpu_test(model, data_loader):
    """The results of ``model`` on every sample of ``data_loader`` (one process)."""
    return _run(model, data_loader).results


def multi_gpu_test(model, data_loader, tmpdir=None, gpu_collect=False):
    """The results of every rank's samples, gathered in sample order (``tmpdir`` and
    ``gpu_collect`` are accepted and unused: the results are gathered in memory)."""
    return _run(model, data_loader).gathered()


__all__ = ['single_gpu_test', 'multi_gpu_test']
