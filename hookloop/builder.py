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
    """An optimizer over ``model``'s trainable parameters (objects pass through)."""
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if isinstance(optimizer, Mapping):
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError('the model has no trainable parameters for the optimizer')
        try:
            return OPTIMIZERS.build(optimizer, params=params)
        except ValueError as exc:  # torch's own checks: "Invalid learning rate: -1", ...
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f'optimizer {optimizer.get("type")!r}: {exc}') from None
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
    for flag in ('shuffle', 'drop_last', 'pin_memory', 'persistent_workers'):
        if flag in kwargs and not isinstance(kwargs[flag], bool):
            raise ConfigError(f'{name} {flag} must be True or False, got {kwargs[flag]!r}')
    workers = kwargs.get('num_workers', 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f'{name} num_workers must be an int >= 0, got {workers!r}')
    kwargs['dataset'] = build_dataset(kwargs['dataset'])
    try:
        len(kwargs['dataset'])
    except TypeError:
        raise ConfigError(f'{name}: the dataset must have a length (map-style); pass an IterableDataset '
                          'inside a DataLoader instead') from None
    return resumable_loader(seed=seed, rank=rank, world_size=world_size, **kwargs)
