"""The ``dreambooth_diffusion`` trainer's arguments, checked and turned into configs before a
model is built: the model config (a directory picks its back-end), the instance samples, the
resolution against the VAE factor, the back-end options and the optimizer's parameter groups."""
import os
from collections.abc import Mapping

import torch
from torch.utils.data import Dataset

from ..engine.builder import build_dataset
from ..errors import ConfigError
from ..registry import MODELS, OPTIMIZERS
from .dataset import list_samples

# Arguments of the diffusers back-end that the trainer takes too (the names of diffusers' scripts).
_MODEL_OPTIONS = dict(lora=None, train_text_encoder=False, tokenizer_max_length=None, snr_gamma=None,
                      noise_offset=0.0, gradient_checkpointing=False)


def model_config(model):
    """``model`` as an nn.Module or a MODELS config; a directory picks its back-end."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise ConfigError(f'dreambooth_diffusion model {path!r} is not a local directory (give a '
                              'pretrained_model_name_or_path saved on disk, or a model config dict)')
        kind = 'TinyDiffusion' if os.path.isfile(os.path.join(path, 'tiny_diffusion.json')) else 'DiffusersDreamBooth'
        return dict(type=kind, pretrained_model_name_or_path=path)
    return model


def static_scale_factor(model):
    """The VAE factor of a model config, read without building the model (None: unknown)."""
    if isinstance(model, Mapping) and isinstance(model.get('type'), str) and model['type'] in MODELS:
        reader = getattr(MODELS.get(model['type']), 'scale_factor_from_config', None)
        return reader(model) if reader is not None else None
    return getattr(model, 'vae_scale_factor', None)


def check_resolution(resolution, factor):
    if resolution is None or factor is None:
        return
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1:
        raise ConfigError(f'dreambooth_diffusion resolution must be a positive int, got {resolution!r}')
    if resolution % factor:
        raise ConfigError(f'dreambooth_diffusion resolution {resolution} is not divisible by the VAE '
                          f'down-sampling factor {factor}; use a multiple of {factor}, e.g. '
                          f'{max(factor, resolution // factor * factor)}')


def instance_samples(instance_data_dir, instance_data):
    if (instance_data_dir is None) == (instance_data is None):
        raise ConfigError('dreambooth_diffusion needs exactly one of instance_data_dir (a directory of '
                          'subject images) and instance_data (tensors or a dataset); got '
                          f'instance_data_dir={instance_data_dir!r} and instance_data={type(instance_data).__name__}')
    if instance_data_dir is not None:
        path = os.fspath(instance_data_dir)
        if not os.path.isdir(path):
            raise ConfigError(f'dreambooth_diffusion instance_data_dir {path!r} does not exist or is not a directory')
        samples = list_samples(path)
        if not samples:
            raise ConfigError(f'dreambooth_diffusion instance_data_dir {path!r} holds no images '
                              '(.png, .jpg, .jpeg, .webp, .bmp) or .safetensors samples')
        return samples
    if isinstance(instance_data, Mapping):
        instance_data = build_dataset(instance_data)
    if isinstance(instance_data, torch.Tensor):
        instance_data = list(instance_data)
    elif isinstance(instance_data, Dataset):
        instance_data = [instance_data[i] for i in range(len(instance_data))]
    if not isinstance(instance_data, (list, tuple)) or not instance_data or \
            not all(isinstance(x, torch.Tensor) for x in instance_data):
        raise ConfigError('dreambooth_diffusion instance_data must be a non-empty tensor (N, ...), list of '
                          f'tensors or dataset of tensors, got {type(instance_data).__name__} '
                          f'of length {len(instance_data) if hasattr(instance_data, "__len__") else "?"}')
    return list(instance_data)


def is_diffusers_backend(kind):
    """Whether a model config's ``type`` is DiffusersDreamBooth or a subclass of it."""
    from .diffusers_backend import DiffusersDreamBooth
    if isinstance(kind, str):
        kind = MODELS.get(kind) if kind in MODELS else None
    return isinstance(kind, type) and issubclass(kind, DiffusersDreamBooth)


def with_model_options(model, options):
    """Put the back-end options given to the trainer into the model config."""
    given = {k: v for k, v in options.items() if v != _MODEL_OPTIONS[k]}
    if not given:
        return model
    if not isinstance(model, Mapping):
        raise ConfigError(f'dreambooth_diffusion {sorted(given)} configure the diffusers back-end: give the model '
                          f'as a pipeline directory or a config dict, not a built {type(model).__name__} '
                          '(or pass them to its constructor)')
    if not is_diffusers_backend(model.get('type')):
        raise ConfigError(f'dreambooth_diffusion {sorted(given)} need the diffusers back-end (a pipeline '
                          f'directory or dict(type="DiffusersDreamBooth", ...)), not {model.get("type")!r}')
    clash = sorted(set(given) & set(model))
    if clash:
        raise ConfigError(f'dreambooth_diffusion {clash} given both to the trainer and in the model config')
    return {**model, **given}


def optimizer_with_groups(optimizer, model, text_encoder_lr, use_8bit_adam):
    """The optimizer over the trainable parameters: the text encoder's in their own group
    at ``text_encoder_lr``; ``bitsandbytes.optim.AdamW8bit`` with ``use_8bit_adam``."""
    cfg = dict(optimizer)
    kind = cfg.pop('type', 'AdamW')
    text = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith('text_encoder.')]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith('text_encoder.')]
    if text_encoder_lr is not None and not text:
        raise ConfigError('dreambooth_diffusion text_encoder_lr is set but the text encoder does not train '
                          '(set train_text_encoder=True or lora=dict(..., text_encoder=True))')
    groups = [{'params': rest}] + ([{'params': text, 'lr': text_encoder_lr}] if text and text_encoder_lr else [])
    if len(groups) == 1 and text:
        groups[0]['params'] = rest + text
    if use_8bit_adam:
        try:
            import bitsandbytes
        except ImportError as exc:
            raise ConfigError(f'dreambooth_diffusion use_8bit_adam=True needs bitsandbytes, which cannot be '
                              f'imported here ({exc}); pip install bitsandbytes, or set use_8bit_adam=False') from None
        if kind not in ('AdamW', 'Adam'):
            raise ConfigError(f'dreambooth_diffusion use_8bit_adam=True replaces AdamW; optimizer type is {kind!r}')
        return bitsandbytes.optim.AdamW8bit(groups, **cfg)
    return OPTIMIZERS.build(dict(type=kind, **cfg), params=groups)


def cumulative_iters(optimizer_config):
    if isinstance(optimizer_config, Mapping):
        return int(optimizer_config.get('cumulative_iters', 1))
    return int(getattr(optimizer_config, 'cumulative_iters', 1) or 1)


def nonempty_prompt(name, value):
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'dreambooth_diffusion {name} must be a non-empty string, got {value!r}')
