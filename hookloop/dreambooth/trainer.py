"""The ``dreambooth_diffusion`` trainer: DreamBooth fine-tuning (Ruiz et al., 2022).

It is a :class:`~hookloop.trainer.Trainer` with two additions only: it builds the
instance/class dataset and generates the missing class samples with the frozen model
before the run, and it sets the two-term loss. Stepping, mixed precision, checkpoints,
logging and the final pipeline directory are hooks.
"""
import inspect
import os
from collections.abc import Mapping

import torch
from torch.utils.data import Dataset

from ..builder import build_dataset, build_model
from ..data import mix_seed, seed_everything
from ..dist import is_distributed
from ..errors import ConfigError
from ..registry import MODELS, TRAINERS, check_call_arguments
from ..trainer import Trainer
from .dataset import DreamBoothDataset, collate_dreambooth, list_samples
from .loss import PriorPreservationLoss

_TRAINER_ARGS = [name for name in inspect.signature(Trainer.__init__).parameters if name != 'self']


def _model_config(model):
    """``model`` as an nn.Module or a MODELS config; a directory picks its back-end."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise ConfigError(f'dreambooth_diffusion model {path!r} is not a local directory (give a '
                              'pretrained_model_name_or_path saved on disk, or a model config dict)')
        kind = 'TinyDiffusion' if os.path.isfile(os.path.join(path, 'tiny_diffusion.json')) else 'DiffusersDreamBooth'
        return dict(type=kind, pretrained_model_name_or_path=path)
    return model


def _static_scale_factor(model):
    """The VAE factor of a model config, read without building the model (None: unknown)."""
    if isinstance(model, Mapping) and isinstance(model.get('type'), str) and model['type'] in MODELS:
        reader = getattr(MODELS.get(model['type']), 'scale_factor_from_config', None)
        return reader(model) if reader is not None else None
    return getattr(model, 'vae_scale_factor', None)


def _check_resolution(resolution, factor):
    if resolution is None or factor is None:
        return
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1:
        raise ConfigError(f'dreambooth_diffusion resolution must be a positive int, got {resolution!r}')
    if resolution % factor:
        raise ConfigError(f'dreambooth_diffusion resolution {resolution} is not divisible by the VAE '
                          f'down-sampling factor {factor}; use a multiple of {factor}, e.g. '
                          f'{max(factor, resolution // factor * factor)}')


def _instance_samples(instance_data_dir, instance_data):
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


def _nonempty_prompt(name, value):
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'dreambooth_diffusion {name} must be a non-empty string, got {value!r}')


@TRAINERS.register_module(module_name=['dreambooth_diffusion', 'DreamBoothDiffusionTrainer'])
class DreamBoothDiffusionTrainer(Trainer):
    """DreamBooth: teach a text-to-image model a subject from a few images.

    Args:
        model: a back-end module, a config dict (``dict(type='TinyDiffusion', ...)`` or
            ``dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=...)``), or a local
            directory (a diffusers pipeline, or one written by ``TinyDiffusion.save_pretrained``).
        instance_prompt: the prompt naming the subject, e.g. ``'a photo of sks dog'``.
        instance_data_dir: a directory of subject images (or ``.safetensors`` samples);
        instance_data: instead, in-memory samples: a tensor ``(N, ...)`` in [-1, 1], a list of
            tensors, or a dataset (or DATASETS config) of tensors.
        with_prior_preservation: add the class-prior term (needs ``class_prompt``).
        class_prompt: the prompt of the subject's class, e.g. ``'a photo of dog'``.
        prior_loss_weight: weight of the prior term (>= 0).
        num_class_images: class samples to use; missing ones are generated before the run.
        class_data_dir: where class samples are kept (default ``<work_dir>/class_samples``);
            existing ones are reused.
        resolution: image side the instance images are resized / cropped to; must be a
            multiple of the VAE down-sampling factor. Default: the model's native size.
        sample_batch_size: prompts per generation call when making class samples.
        pipeline_dir: where the fine-tuned pipeline is saved at the end (relative to the
            work dir; None saves none).
        train_dataloader: loader options such as ``dict(batch_size=2, num_workers=2)``; the
            dataset and collate function are the trainer's (default ``batch_size=1, shuffle=True``).
        **kwargs: every other :class:`~hookloop.trainer.Trainer` argument (``optimizer``,
            ``max_iters``, ``optimizer_config=dict(precision='fp16')``, ``checkpoint_config``,
            ``resume_from``, ...). ``loss_fn`` is the trainer's own and may not be given.
    """

    def __init__(self, model, instance_prompt=None, instance_data_dir=None, instance_data=None,
                 class_prompt=None, with_prior_preservation=False, prior_loss_weight=1.0,
                 num_class_images=100, class_data_dir=None, resolution=None, sample_batch_size=4,
                 pipeline_dir='pipeline', train_dataloader=None, **kwargs):
        if any(key not in _TRAINER_ARGS for key in kwargs):  # a clear error naming the argument
            check_call_arguments(Trainer.__init__, {'model': model, **kwargs}, what='dreambooth_diffusion')
        if 'loss_fn' in kwargs:
            raise ConfigError('dreambooth_diffusion sets its own loss (instance + prior_loss_weight * prior); '
                              'do not pass loss_fn')
        # Everything that can be checked without loading a model is checked first.
        _nonempty_prompt('instance_prompt', instance_prompt)
        instance_samples = _instance_samples(instance_data_dir, instance_data)
        if not isinstance(with_prior_preservation, bool):
            raise ConfigError(f'dreambooth_diffusion with_prior_preservation must be True or False, '
                              f'got {with_prior_preservation!r}')
        if with_prior_preservation:
            if class_prompt is None:
                raise ConfigError('dreambooth_diffusion with_prior_preservation=True needs a class_prompt '
                                  "(the subject's class, e.g. 'a photo of dog')")
            _nonempty_prompt('class_prompt', class_prompt)
            if isinstance(num_class_images, bool) or not isinstance(num_class_images, int) or num_class_images < 1:
                raise ConfigError(f'dreambooth_diffusion num_class_images must be a positive int, '
                                  f'got {num_class_images!r}')
        if isinstance(prior_loss_weight, bool) or not isinstance(prior_loss_weight, (int, float)) or \
                not prior_loss_weight >= 0:
            raise ConfigError(f'dreambooth_diffusion prior_loss_weight must be a number >= 0, '
                              f'got {prior_loss_weight!r}')
        if isinstance(sample_batch_size, bool) or not isinstance(sample_batch_size, int) or sample_batch_size < 1:
            raise ConfigError(f'dreambooth_diffusion sample_batch_size must be a positive int, '
                              f'got {sample_batch_size!r}')
        model = _model_config(model)
        _check_resolution(resolution, _static_scale_factor(model))

        seed = kwargs.get('seed')
        if isinstance(seed, int) and not isinstance(seed, bool):
            seed_everything(seed)  # as the base Trainer does before it builds a model
        model = build_model(model)
        for needed in ('generate', 'save_sample', 'save_pretrained', 'vae_scale_factor'):
            if not hasattr(model, needed):
                raise ConfigError(f'dreambooth_diffusion: the model {type(model).__name__} has no {needed!r}; '
                                  'use TinyDiffusion, DiffusersDreamBooth or a module with the same interface')
        _check_resolution(resolution, model.vae_scale_factor)
        native = getattr(model, 'resolution', None)
        if resolution is None:
            resolution = native
        elif getattr(model, 'fixed_resolution', False) and resolution != native:
            raise ConfigError(f'dreambooth_diffusion resolution {resolution} does not match the model\'s fixed '
                              f'sample size {native}')

        if class_data_dir is None and with_prior_preservation:
            class_data_dir = os.path.join(os.path.abspath(os.fspath(kwargs.get('work_dir', 'work_dirs/default'))),
                                          'class_samples')
        self.instance_prompt, self.class_prompt = instance_prompt, class_prompt
        self.with_prior_preservation, self.prior_loss_weight = with_prior_preservation, prior_loss_weight
        self.num_class_images = num_class_images if with_prior_preservation else 0
        self.class_data_dir = class_data_dir if with_prior_preservation else None
        self.resolution, self.sample_batch_size = resolution, sample_batch_size
        self.dreambooth_dataset = DreamBoothDataset(
            instance_samples, instance_prompt, self.class_data_dir, class_prompt, self.num_class_images,
            resolution, getattr(model, 'sample_channels', 3))

        loader = dict(batch_size=1, shuffle=True)
        if train_dataloader is not None:
            if not isinstance(train_dataloader, Mapping) or 'dataset' in train_dataloader or \
                    'collate_fn' in train_dataloader:
                raise ConfigError('dreambooth_diffusion builds its own dataset: give train_dataloader as loader '
                                  f'options only, e.g. dict(batch_size=2, num_workers=2); got {train_dataloader!r}')
            loader.update(train_dataloader)
        loader.update(dataset=self.dreambooth_dataset, collate_fn=collate_dreambooth)

        custom_hooks = kwargs.pop('custom_hooks', None)
        custom_hooks = [custom_hooks] if isinstance(custom_hooks, Mapping) else list(custom_hooks or [])
        if pipeline_dir is not None:
            custom_hooks.append(dict(type='SavePipelineHook', out_dir=pipeline_dir))
        super().__init__(model, train_dataloader=loader, custom_hooks=custom_hooks,
                         loss_fn=PriorPreservationLoss(prior_loss_weight, with_prior_preservation), **kwargs)

    def train(self):
        """Generate the missing class samples, then train as any Trainer does."""
        self.generate_class_images()
        return super().train()

    @torch.no_grad()
    def generate_class_images(self):
        """Fill ``class_data_dir`` up to ``num_class_images`` samples drawn from the frozen
        model with the class prompt. Existing samples are reused; the global RNG is not
        touched (each batch has its own generator seeded from the run's seed and the
        sample index), so generating or reusing leaves training unchanged."""
        if not self.with_prior_preservation:
            return
        if self.rank == 0:
            os.makedirs(self.class_data_dir, exist_ok=True)
            existing = list_samples(self.class_data_dir)
            missing = self.num_class_images - len(existing)
            if missing <= 0:
                self.logger.info('reusing %d class samples in %s', len(existing), self.class_data_dir)
            else:
                self.logger.info('generating %d class samples for %r in %s', missing, self.class_prompt,
                                 self.class_data_dir)
                was_training = self.model.training
                self.model.eval()
                taken = {os.path.splitext(os.path.basename(p))[0] for p in existing}
                index = 0
                for start in range(0, missing, self.sample_batch_size):
                    count = min(self.sample_batch_size, missing - start)
                    generator = torch.Generator().manual_seed(mix_seed(self.seed, len(existing) + start))
                    samples = self.model.generate([self.class_prompt] * count, generator=generator,
                                                 resolution=self.resolution)
                    for sample in samples:
                        while f'class_{index:05d}' in taken:
                            index += 1
                        taken.add(f'class_{index:05d}')
                        self.model.save_sample(sample, os.path.join(self.class_data_dir, f'class_{index:05d}'))
                self.model.train(was_training)
        if is_distributed():
            torch.distributed.barrier()
        self.dreambooth_dataset.refresh_class_samples()
