"""Which way a train loader resumes mid-pass, and whose ``state_dict`` holds its position.

Three ways, best first (``docs/data.md`` has the table):

* ``'sampler'`` — hookloop's :class:`~hookloop.data.resumable.ResumableBatchSampler` starts at the
  saved batch: nothing is read twice, O(1).
* ``'state'`` — the loader (torchdata ``StatefulDataLoader``, a user's class) or, read in the
  main process, its dataset (an HF ``datasets.IterableDataset``) has ``state_dict()`` /
  ``load_state_dict()``: the state is saved with every checkpoint and loaded before the
  resumed iterator is created.
* ``'fast_forward'`` — anything else: the resumed run reads the pass from its start and drops
  the batches already trained on (the weights still match; the reading costs time).
"""
from torch.utils.data import IterableDataset

from .resumable import ResumableBatchSampler
from .hf_dataset import has_shuffle_buffer


def has_state(obj):
    return callable(getattr(obj, 'state_dict', None)) and callable(getattr(obj, 'load_state_dict', None))


def _is_stateful_dataloader(loader):
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return False
    return isinstance(loader, StatefulDataLoader)


def resume_plan(loader):
    """``(way, owner, reason)``: ``way`` as in the module docstring, ``owner`` the object whose
    state is saved (``'state'`` only), ``reason`` why a fast-forward is needed (for the warning)."""
    if isinstance(getattr(loader, 'batch_sampler', None), ResumableBatchSampler):
        return 'sampler', None, None
    dataset = getattr(loader, 'dataset', None)
    if has_shuffle_buffer(dataset):
        return 'fast_forward', None, ('its HF dataset uses a .shuffle() buffer, which datasets leaves out of '
                                      'state_dict; the pass is replayed from set_epoch instead')
    if has_state(loader):
        if (_is_stateful_dataloader(loader) and isinstance(dataset, IterableDataset)
                and not has_state(dataset)):
            return 'fast_forward', None, f'its dataset {type(dataset).__name__} has no state_dict'
        return 'state', loader, None
    if has_state(dataset):
        if getattr(loader, 'num_workers', 0) == 0:
            return 'state', dataset, None
        return 'fast_forward', None, (f'the state of {type(dataset).__name__} lives in the data-loader workers; '
                                      'use torchdata.stateful_dataloader.StatefulDataLoader to save it')
    what = type(dataset).__name__ if dataset is not None else type(loader).__name__
    return 'fast_forward', None, f'{what} has no state_dict (use StatefulDataLoader, or a map-style dataset)'
