"""``mmcv.runner.checkpoint``: MMCV's checkpoint functions over hookloop's safe loading.

Every load is ``torch.load(weights_only=True)``: a checkpoint from a stranger runs no code.
``CheckpointLoader`` picks a loader by the path's prefix, as MMCV does (the longest matching
scheme; user code registers more with ``register_scheme``):

===============================  ==============================================================
``''`` (a local path)            ``load_from_local``
``http://``, ``https://``        ``load_from_http`` (torch.hub's download cache)
``torchvision://``, ``modelzoo://`` ``load_from_torchvision`` (torchvision's weights of that name)
``s3://``                        ``load_from_ceph``: fsspec's ``s3`` (hookloop's storage)
``<cluster>:s3://``              refused: a Petrel cluster (``petrel_client``) is MMCV's own
``open-mmlab://``, ``mmcls://``  refused: names in MMCV's model-zoo tables, which hookloop lacks
``pavi://``                      ``load_from_pavi`` (the ``pavi`` package downloads it)
===============================  ==============================================================
"""
import os
import re
import tempfile
from collections import OrderedDict

import torch

from ...checkpoint.format import load_checkpoint as _load_file
from ...checkpoint.gate import baseline_of, export_file
from ...engine.checkpointer import plain
from ...engine.runner_names import model_meta, revise_state_keys
from ...errors import CheckpointError, ConfigAssertionError, ConfigError, ConfigTypeError
from ...fileio import storage
from .parallel import is_module_wrapper
from .utils import print_log


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """MMCV raises FileNotFoundError for a checkpoint that is not there."""


class CheckpointLoader:
    """MMCV's ``CheckpointLoader``: a loader per path prefix (a regular expression matched
    at the start of the path; the first in reverse name order wins, as in MMCV)."""

    _schemes = {}

    @classmethod
    def _register_scheme(cls, prefixes, loader, force=False):
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        for prefix in prefixes:
            if prefix in cls._schemes and not force:
                raise KeyError(f'{prefix} is already registered as a loader backend, add "force=True" if you '
                               'want to override it')
            cls._schemes[prefix] = loader
        cls._schemes = OrderedDict(sorted(cls._schemes.items(), key=lambda item: item[0], reverse=True))

    @classmethod
    def register_scheme(cls, prefixes, loader=None, force=False):
        """Register ``loader(filename, map_location)`` for ``prefixes`` (also as a decorator)."""
        if loader is not None:
            cls._register_scheme(prefixes, loader, force=force)
            return loader

        def decorator(function):
            cls._register_scheme(prefixes, function, force=force)
            return function
        return decorator

    @classmethod
    def _get_checkpoint_loader(cls, path):
        for prefix, loader in cls._schemes.items():
            if re.match(prefix, path) is not None:
                return loader

    @classmethod
    def load_checkpoint(cls, filename, map_location=None, logger=None):
        """The checkpoint at ``filename``, by the loader of its prefix."""
        loader = cls._get_checkpoint_loader(filename)
        print_log(f'load checkpoint from {loader.__name__[10:]} path: {filename}', logger)
        return loader(filename, map_location)


@CheckpointLoader.register_scheme(prefixes='')
def load_from_local(filename, map_location):
    """A local file (``~`` expanded), ``weights_only``."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise CheckpointNotFoundError(f'{filename} can not be found.')
    return _load_file(filename, map_location=map_location or 'cpu')


@CheckpointLoader.register_scheme(prefixes=('http://', 'https://'))
def load_from_http(filename, map_location=None, model_dir=None):
    """A download (cached in torch.hub's directory), ``weights_only``."""
    return torch.hub.load_state_dict_from_url(filename, model_dir=model_dir, map_location=map_location,
                                              weights_only=True)


@CheckpointLoader.register_scheme(prefixes=('modelzoo://', 'torchvision://'))
def load_from_torchvision(filename, map_location=None):
    """``torchvision://resnet50``: torchvision's ImageNet weights of that model (the first ones,
    ``IMAGENET1K_V1``, as MMCV's table names them)."""
    try:
        from torchvision import models
    except ImportError:
        raise ConfigError(f'{filename}: torchvision:// names need torchvision (pip install torchvision)') from None
    name = filename.split('://', 1)[1]
    try:
        weights = models.get_model_weights(name)
    except ValueError:
        raise ConfigError(f'{filename}: torchvision has no model {name!r}') from None
    chosen = getattr(weights, 'IMAGENET1K_V1', None) or weights.DEFAULT
    return load_from_http(chosen.url, map_location=map_location)


@CheckpointLoader.register_scheme(prefixes=('open-mmlab://', 'openmmlab://'))
def load_from_openmmlab(filename, map_location=None):
    """Refused: the name is a key of MMCV's model-zoo table, which hookloop does not ship."""
    raise ConfigError(f'{filename}: open-mmlab:// names are keys of MMCV\'s model-zoo table (mmcv/model_zoo/'
                      'open_mmlab.json), which hookloop does not ship; give the https:// URL that table lists')


@CheckpointLoader.register_scheme(prefixes='mmcls://')
def load_from_mmcls(filename, map_location=None):
    """Refused: the name is a key of mmcls's model-zoo table."""
    raise ConfigError(f'{filename}: mmcls:// names are keys of MMCV\'s mmcls model-zoo table (mmcv/model_zoo/'
                      'mmcls.json), which hookloop does not ship; give the https:// URL that table lists')


@CheckpointLoader.register_scheme(prefixes=r'(\S+\:)?s3://')
def load_from_ceph(filename, map_location=None, backend='petrel'):
    """``s3://bucket/key`` through fsspec (hookloop's storage); a Petrel cluster name
    (``open-mmlab:s3://``) is refused: ``petrel_client`` is not supported."""
    if not filename.startswith('s3://'):
        raise ConfigError(f'{filename}: a Petrel cluster (petrel_client) is not supported; hookloop reads s3:// '
                          'through fsspec (s3fs), with fsspec\'s credentials')
    if not storage.exists(filename):
        raise CheckpointNotFoundError(f'{filename} can not be found.')
    return _load_file(filename, map_location=map_location or 'cpu')


@CheckpointLoader.register_scheme(prefixes='pavi://')
def load_from_pavi(filename, map_location=None):
    """``pavi://<model path>``: downloaded with ``pavi.modelcloud``, then loaded ``weights_only``."""
    if not filename.startswith('pavi://'):
        raise ConfigAssertionError(f'Expected filename startswith `pavi://`, but get {filename}')
    try:
        from pavi import modelcloud
    except ImportError:
        raise ConfigError('Please install pavi to load checkpoint from modelcloud.') from None
    model = modelcloud.get(filename[len('pavi://'):])
    with tempfile.TemporaryDirectory() as directory:
        downloaded = os.path.join(directory, model.name)
        model.download(downloaded)
        return load_from_local(downloaded, map_location)


def _load_checkpoint(filename, map_location=None, logger=None):
    """MMCV's ``_load_checkpoint``: the checkpoint at ``filename`` (any registered scheme)."""
    return CheckpointLoader.load_checkpoint(filename, map_location, logger)


def _load_checkpoint_with_prefix(prefix, filename, map_location=None):
    """The weights under ``prefix`` (``'backbone'``) of the checkpoint, with the prefix removed."""
    checkpoint = _load_checkpoint(filename, map_location=map_location)
    state_dict = checkpoint.get('state_dict', checkpoint)
    if not prefix.endswith('.'):
        prefix += '.'
    state_dict = {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}
    if not state_dict:
        raise ConfigAssertionError(f'{prefix} is not in the pretrained model')
    return state_dict


def get_state_dict(module, destination=None, prefix='', keep_vars=False):
    """``module.state_dict()`` with every module wrapper (``MODULE_WRAPPERS``) on the way left
    out of the names, at any depth (a wrapped sub-module keeps its own name)."""
    if is_module_wrapper(module):
        module = module.module
    if destination is None:
        destination = OrderedDict()
        destination._metadata = OrderedDict()
    destination._metadata[prefix[:-1]] = local_metadata = dict(version=module._version)
    module._save_to_state_dict(destination, prefix, keep_vars)
    for name, child in module._modules.items():
        if child is not None:
            get_state_dict(child, destination, prefix + name + '.', keep_vars=keep_vars)
    for hook in module._state_dict_hooks.values():
        result = hook(module, destination, prefix, local_metadata)
        if result is not None:
            destination = result
    return destination


def load_checkpoint(model, filename, map_location='cpu', strict=False, logger=None,
                    revise_keys=((r'^module\.', ''),)):
    """Load ``filename``'s weights into ``model`` (``weights_only``), renaming keys first
    (the state dict's ``_metadata`` is kept); returns the checkpoint."""
    checkpoint = _load_checkpoint(filename, map_location, logger)
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f'No state_dict found in checkpoint file {filename}')
    state = revise_state_keys(checkpoint.get('state_dict', checkpoint), revise_keys)
    target = model.module if is_module_wrapper(model) else model
    result = target.load_state_dict(state, strict=strict)
    if (result.missing_keys or result.unexpected_keys) and logger is not None:
        logger.warning('load_checkpoint %s: missing keys %s, unexpected keys %s', filename, result.missing_keys,
                       result.unexpected_keys)
    return checkpoint


def save_checkpoint(model, filename, optimizer=None, meta=None, file_client_args=None):
    """Write ``model``'s weights (the state dict of the model inside its wrappers), the
    optimizer state (one optimizer or a dict of them) and ``meta`` (which gets ``CLASSES``
    from the model), MMCV's layout, through the weights gate (``checkpoint/gate.py``: refused
    with ``InvalidLossError`` when the weights hold a NaN/inf the run training ``model`` did
    not start with; atomic; a checksum sidecar). ``filename`` is a local path or an fsspec
    URL; ``file_client_args`` may name the ``'disk'`` backend only."""
    if meta is not None and not isinstance(meta, dict):
        raise ConfigTypeError(f'meta must be a dict or None, but got {type(meta).__name__}')
    backend = (file_client_args or {}).get('backend', 'disk')
    if backend not in ('disk', 'local'):
        raise ConfigError(f"save_checkpoint file_client_args backend {backend!r} is not supported: hookloop writes to "
                          "a local path or an fsspec URL (s3://, gs://, ...) given as the filename")
    inner = model.module if is_module_wrapper(model) else model
    state = get_state_dict(model)
    weights = OrderedDict((key, value.detach().cpu()) for key, value in state.items())
    weights._metadata = state._metadata  # the modules' versions, which old checkpoints are converted by
    checkpoint = {'meta': plain({**model_meta(inner), **(meta or {})}), 'state_dict': weights}
    if isinstance(optimizer, dict):
        checkpoint['optimizer'] = {name: opt.state_dict() for name, opt in optimizer.items()}
    elif optimizer is not None:
        checkpoint['optimizer'] = optimizer.state_dict()
    if not storage.is_url(filename):
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
    trained = {key: checkpoint[key] for key in ('state_dict', 'optimizer') if key in checkpoint}
    export_file(filename, lambda file: torch.save(checkpoint, file), trained, baseline_of(inner), 'checkpoint')


__all__ = ['CheckpointLoader', 'get_state_dict', 'load_checkpoint', 'save_checkpoint', 'load_from_local',
           'load_from_http', 'load_from_torchvision', 'load_from_openmmlab', 'load_from_mmcls', 'load_from_ceph',
           'load_from_pavi', '_load_checkpoint', '_load_checkpoint_with_prefix']
