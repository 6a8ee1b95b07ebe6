"""Hugging Face ``datasets`` as a train or val source: the ``HFDataset`` registry type and the
few facts about HF datasets that resume and sharding need.

``datasets`` is optional (``pip install hookloop[data]``); nothing here imports it until a
config asks for an ``HFDataset`` or a dataset object turns out to be one.
"""
import sys

from ..errors import ConfigError
from ..registry import DATASETS


@DATASETS.register_module()
def HFDataset(path, name=None, data_files=None, split='train', streaming=False, format='torch', columns=None,
              shuffle_buffer_size=None, shuffle_seed=0, **load_kwargs):
    """``datasets.load_dataset(path, name, data_files=..., split=..., streaming=...)``, formatted.

    Args:
        path, name, data_files, split, streaming: as for ``datasets.load_dataset``; a local
            builder (``'json'``, ``'parquet'``, ``'csv'``) with ``data_files`` needs no network.
        format: ``'torch'`` (numbers become tensors, floats float32) or ``None`` to keep Python values.
        columns: keep only these columns.
        shuffle_buffer_size, shuffle_seed: for a streaming dataset, ``.shuffle(seed, buffer_size)``
            (reshuffled each pass: the trainer calls ``set_epoch``). A map-style dataset is
            shuffled by the loader's ``shuffle=True`` instead.
    """
    try:
        import datasets
    except ImportError:
        raise ConfigError('HFDataset needs the datasets package: pip install "hookloop[data]"') from None
    if split is None:
        raise ConfigError('HFDataset needs a split (e.g. split="train"): the trainer reads one split')
    dataset = datasets.load_dataset(path, name, data_files=data_files, split=split, streaming=streaming,
                                    **load_kwargs)
    if columns is not None:
        dataset = dataset.select_columns(list(columns))
    if shuffle_buffer_size is not None:
        if not streaming:
            raise ConfigError('HFDataset: shuffle_buffer_size is for streaming=True; shuffle a map-style '
                              'dataset with the loader (train_dataloader=dict(..., shuffle=True))')
        dataset = dataset.shuffle(seed=shuffle_seed, buffer_size=shuffle_buffer_size)
    if format is not None:
        dataset = dataset.with_format(format)
    return dataset


def is_hf_iterable(dataset):
    """True for a ``datasets.IterableDataset`` (checked without importing ``datasets``)."""
    module = sys.modules.get('datasets')
    return module is not None and isinstance(dataset, module.IterableDataset)


def has_shuffle_buffer(dataset):
    """True when an HF streaming dataset draws from a ``.shuffle()`` buffer: its ``state_dict``
    leaves the buffer out (``datasets`` refills it on load), so that state does not resume exactly."""
    if not is_hf_iterable(dataset):
        return False
    from datasets.iterable_dataset import BufferShuffledExamplesIterable
    node, seen = getattr(dataset, '_ex_iterable', None), 0
    while node is not None and seen < 1000:  # the chain of wrapped example iterables
        if isinstance(node, BufferShuffledExamplesIterable):
            return True
        node, seen = getattr(node, 'ex_iterable', None), seen + 1
    return False


def split_for_rank(dataset, rank, world_size):
    """This rank's part of an HF streaming dataset (``split_dataset_by_node``): whole shards when
    their number divides by ``world_size``, else every ``world_size``-th example. A dataset the
    user split already is returned as it is."""
    if world_size == 1 or not is_hf_iterable(dataset) or getattr(dataset, '_distributed', None) is not None:
        return dataset
    from datasets.distributed import split_dataset_by_node
    return split_dataset_by_node(dataset, rank=rank, world_size=world_size)


def is_hf_map(dataset):
    """True for a map-style ``datasets.Dataset`` (not a ``torch.utils.data.Dataset`` subclass)."""
    module = sys.modules.get('datasets')
    return module is not None and isinstance(dataset, module.Dataset)


def _skeleton(state):
    """The shape of an HF state: the set of example-iterable types in it, without positions."""
    if isinstance(state, dict):
        found = {state['type']} if isinstance(state.get('type'), str) else set()
        for value in state.values():
            found |= _skeleton(value)
        return found
    if isinstance(state, list):
        return set().union(*map(_skeleton, state)) if state else set()
    return set()


def _hf_states(state):
    """Every HF ``IterableDataset`` state inside a (loader's) saved state."""
    if isinstance(state, dict):
        if 'examples_iterable' in state and 'epoch' in state:
            yield state
            return
        for value in state.values():
            yield from _hf_states(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _hf_states(value)


def _shard_indices(state):
    if isinstance(state, dict):
        if isinstance(state.get('shard_idx'), int):
            yield state['shard_idx']
        for value in state.values():
            yield from _shard_indices(value)


def state_mismatch(dataset, saved, in_workers):
    """Why the saved ``state_dict`` cannot resume the HF stream ``dataset``, or None.
    ``datasets`` itself loads a state from other data without complaint (it may yield nothing,
    or fail on the first example), so the shape and shard numbers are checked here."""
    if not is_hf_iterable(dataset):
        return None
    try:  # the example iterables a fresh iteration would use (a private API of datasets: may change)
        fresh = _skeleton(dataset._prepare_ex_iterable_for_iteration()._init_state_dict())
    except Exception:
        return None
    for state in _hf_states(saved):
        if _skeleton(state['examples_iterable']) != fresh:
            return 'its pipeline differs (another dataset, .map, .shuffle or format?)'
        if not in_workers and any(index >= dataset.num_shards for index in _shard_indices(state)):
            return f'it points at a shard beyond the {dataset.num_shards} this dataset has (were files removed?)'
    return None
