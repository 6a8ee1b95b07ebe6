"""Turn the trainer's arguments (objects or config dicts) into objects."""
from collections.abc import Mapping

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .data import make_resumable, resumable_loader
from .errors import ConfigError
from .registry import DATASETS, MODELS, OPTIMIZERS, closest_names

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
    optimizers — go through :mod:`hookloop.optim_constructor`."""
    from .optim_constructor import as_optimizer, build_optimizers, is_optimizer_dict_cfg
    optimizer = as_optimizer(optimizer)
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, 'param_groups'):
        return optimizer
    if isinstance(optimizer, Mapping) and ('paramwise_cfg' in optimizer or 'constructor' in optimizer
                                           or is_optimizer_dict_cfg(optimizer)):
        return build_optimizers(model, optimizer)
    if isinstance(optimizer, Mapping):
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError('the model has no trainable parameters for the optimizer')
        return OPTIMIZERS.build(optimizer, params=params)
    raise ConfigError(f'optimizer must be a torch.optim.Optimizer or a config dict, got {type(optimizer).__name__}')


def build_dataset(dataset):
    if isinstance(dataset, Mapping):
        return DATASETS.build(dataset)
    return dataset


def build_dataloader(loader, name, seed, rank=0, world_size=1):
    """A resumable DataLoader from a DataLoader, a config dict or a dataset."""
    if loader is None:
        return None
    if isinstance(loader, DataLoader):
        return make_resumable(loader, seed, rank, world_size)
    if isinstance(loader, Dataset) and not isinstance(loader, Mapping):
        loader = {'dataset': loader}
    if not isinstance(loader, Mapping):
        raise ConfigError(f'{name} must be a DataLoader or a config dict, got {type(loader).__name__}')
    kwargs = dict(loader)
    for key in kwargs:
        if key not in _LOADER_KEYS:
            hint = closest_names(key, _LOADER_KEYS)
            hint = f'; did you mean {", ".join(map(repr, hint))}?' if hint else ''
            raise ConfigError(f'{name} got an unexpected argument {key!r}{hint}')
    if 'dataset' not in kwargs:
        raise ConfigError(f'{name} config has no "dataset"')
    kwargs['dataset'] = build_dataset(kwargs['dataset'])
    try:
        len(kwargs['dataset'])
    except TypeError:
        raise ConfigError(f'{name}: the dataset must have a length (map-style); pass an IterableDataset '
                          'inside a DataLoader instead') from None
    return resumable_loader(seed=seed, rank=rank, world_size=world_size, **kwargs)
