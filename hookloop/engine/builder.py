"""Turn the trainer's arguments (objects or config dicts) into objects."""
import warnings
from collections.abc import Mapping

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..data.resumable import make_resumable, resumable_loader
from ..errors import ConfigError
from ..data.hf_dataset import is_hf_iterable, is_hf_map, split_for_rank
from ..registry import DATASETS, MODELS, OPTIMIZERS, closest_names

_LOADER_KEYS = ('dataset', 'batch_size', 'shuffle', 'drop_last', 'num_workers', 'collate_fn', 'pin_memory',
                'persistent_workers', 'prefetch_factor', 'timeout', 'worker_init_fn')


def build_model(model):
    if isinstance(model, nn.Module):
        return model
    if isinstance(model, Mapping):
        built = MODELS.build(model)
        if not isinstance(built, nn.Module):
            raise ConfigError(f'model {model.get("type")!r} built a {type(built).__name__}, not an nn.Module')
        return built
    raise ConfigError(f'model must be an nn.Module or a config dict, got {type(model).__name__}')


def build_optimizer(optimizer, model):
    """An optimizer over ``model``'s trainable parameters (objects pass through). MMCV's
    shapes — ``paramwise_cfg``, ``constructor`` and ``{sub-module name: cfg}`` for several
    optimizers — go through :mod:`hookloop.optim.constructor`."""
    from ..optim.constructor import as_optimizer, build_optimizers, is_optimizer_dict_cfg
    optimizer = as_optimizer(optimizer)
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, 'param_groups'):
        return optimizer
    if isinstance(optimizer, Mapping) and ('paramwise_cfg' in optimizer or 'constructor' in optimizer
                                           or 'paramwise_options' in optimizer  # mmselfsup's spelling
                                           or is_optimizer_dict_cfg(optimizer)):
        return build_optimizers(model, optimizer)
    if isinstance(optimizer, Mapping):
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError('the model has no trainable parameters for the optimizer')
        _check_numbers(optimizer)
        try:
            return OPTIMIZERS.build(optimizer, params=params)
        except ValueError as exc:  # torch's own checks: "Invalid learning rate: -1", ...
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f'optimizer {optimizer.get("type")!r}: {exc}') from None
    raise ConfigError(f'optimizer must be a torch.optim.Optimizer or a config dict, got {type(optimizer).__name__}')


def _check_numbers(cfg):
    """A ConfigError naming the argument when a value is not a number where the optimizer's
    default is one (``lr='fast'``), instead of torch's comparison error (``'<' not supported``)."""
    import inspect
    kind = cfg.get('type')
    target = OPTIMIZERS.get(kind) if isinstance(kind, str) and kind in OPTIMIZERS else kind
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    for key, value in cfg.items():
        default = parameters[key].default if key in parameters else None
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool) or key == 'lr'
        if numeric and (isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor))) and not (
                value is None and key != 'lr'):  # a custom optimizer may take None for "off"
            raise ConfigError(f'optimizer {kind!r}: {key} must be a number, got {value!r}')
        if isinstance(default, tuple) and all(isinstance(x, (int, float)) for x in default) and not (
                isinstance(value, (tuple, list)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                         for x in value)):
            raise ConfigError(f'optimizer {kind!r}: {key} must be a tuple of numbers like {default!r}, got {value!r}')


def build_dataset(dataset):
    if isinstance(dataset, Mapping):
        return DATASETS.build(dataset)
    return dataset


def _stream_loader_class(kind, name):
    """The loader class a config names: hookloop's choice (``None``), ``'DataLoader'``,
    ``'StatefulDataLoader'`` (torchdata) or a class."""
    if kind is None or kind == 'DataLoader' or kind is DataLoader:
        return kind if kind is None else DataLoader
    if kind == 'StatefulDataLoader':
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError:
            raise ConfigError(f'{name}: type="StatefulDataLoader" needs torchdata: pip install "hookloop[data]"') from None
        return StatefulDataLoader
    if isinstance(kind, type) and issubclass(kind, DataLoader):
        return kind
    raise ConfigError(f'{name}: type must be "DataLoader", "StatefulDataLoader" or a DataLoader class, got {kind!r}')


def _default_stream_loader():
    """torchdata's StatefulDataLoader when installed (it saves a stream's state, also from
    workers); else torch's DataLoader (a stream then resumes by fast-forward)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return DataLoader
    return StatefulDataLoader


def _stream_dataloader(kwargs, loader_class, name, rank, world_size):
    """A loader over an IterableDataset (an HF streaming dataset is split across ranks first)."""
    if kwargs.pop('shuffle', False):
        raise ConfigError(f'{name}: shuffle=True needs a map-style dataset; shuffle a stream inside it, e.g. '
                          'dict(type="HFDataset", ..., streaming=True, shuffle_buffer_size=1000)')
    dataset = kwargs['dataset']
    if world_size > 1:
        if is_hf_iterable(dataset):
            kwargs['dataset'] = split_for_rank(dataset, rank, world_size)
        else:
            warnings.warn(f'{name}: {type(dataset).__name__} is a stream in a {world_size}-rank run; hookloop cannot '
                          'shard it, so it must give each rank its own samples (torch.distributed.get_rank())')
    return (loader_class or _default_stream_loader())(**kwargs)


def _stateful_map_loader(loader_class, kwargs, seed, rank, world_size):
    """A StatefulDataLoader (or other class) over a map-style dataset, seeded from the run's seed."""
    if world_size > 1:
        from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler
        kwargs['sampler'] = StatefulDistributedSampler(kwargs['dataset'], num_replicas=world_size, rank=rank,
                                                       shuffle=kwargs.pop('shuffle', False), seed=seed)
    elif kwargs.pop('shuffle', False):
        # A sampler of its own: torchdata also draws worker seeds from a loader's generator=,
        # which would move the shuffle after a restore.
        from torchdata.stateful_dataloader.sampler import RandomSampler
        kwargs['sampler'] = RandomSampler(kwargs['dataset'], generator=torch.Generator().manual_seed(seed))
    return loader_class(**kwargs)


def build_dataloader(loader, name, seed, rank=0, world_size=1):
    """A loader from a DataLoader, any iterable of batches, a dataset or a config dict.

    Map-style data gets hookloop's resumable sampler unless the config names another loader
    class (``type='StatefulDataLoader'``); a stream (IterableDataset) gets torchdata's
    ``StatefulDataLoader`` when installed. Objects that are already loaders are kept."""
    if loader is None:
        return None
    if isinstance(loader, DataLoader):
        if world_size > 1 and is_hf_iterable(loader.dataset) and getattr(loader.dataset, '_distributed', None) is None:
            warnings.warn(f'{name}: every rank reads the whole HF stream; split it with '
                          'datasets.distributed.split_dataset_by_node, or pass the dataset in a config dict')
        return make_resumable(loader, seed, rank, world_size, name)
    if (isinstance(loader, Dataset) or is_hf_map(loader)) and not isinstance(loader, Mapping):
        loader = {'dataset': loader}
    if not isinstance(loader, Mapping):
        if hasattr(loader, '__iter__') and not isinstance(loader, (str, bytes)):
            return loader  # any iterable of batches: a generator, a list, a user's stream class
        raise ConfigError(f'{name} must be a DataLoader, an iterable of batches or a config dict, '
                          f'got {type(loader).__name__}')
    kwargs = dict(loader)
    loader_class = _stream_loader_class(kwargs.pop('type', None), name)
    for key in kwargs:
        if key not in _LOADER_KEYS:
            hint = closest_names(key, _LOADER_KEYS)
            hint = f'; did you mean {", ".join(map(repr, hint))}?' if hint else ''
            raise ConfigError(f'{name} got an unexpected argument {key!r}{hint}')
    if 'dataset' not in kwargs:
        raise ConfigError(f'{name} config has no "dataset"')
    for flag in ('shuffle', 'drop_last', 'pin_memory', 'persistent_workers'):
        if flag in kwargs and not isinstance(kwargs[flag], bool):
            raise ConfigError(f'{name} {flag} must be True or False, got {kwargs[flag]!r}')
    workers = kwargs.get('num_workers', 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f'{name} num_workers must be an int >= 0, got {workers!r}')
    kwargs['dataset'] = build_dataset(kwargs['dataset'])
    if isinstance(kwargs['dataset'], IterableDataset) or is_hf_iterable(kwargs['dataset']):
        return _stream_dataloader(kwargs, loader_class, name, rank, world_size)
    try:
        len(kwargs['dataset'])
    except TypeError:
        raise ConfigError(f'{name}: {type(kwargs["dataset"]).__name__} has neither a length (map-style) nor '
                          'is it an IterableDataset; give it a __len__ or make it an IterableDataset') from None
    if loader_class is not None:
        return _stateful_map_loader(loader_class, kwargs, seed, rank, world_size)
    return resumable_loader(seed=seed, rank=rank, world_size=world_size, **kwargs)
