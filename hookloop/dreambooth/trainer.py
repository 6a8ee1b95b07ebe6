"""The ``dreambooth_diffusion`` trainer: DreamBooth fine-tuning (Ruiz et al., 2022).

It is a :class:`~hookloop.engine.trainer.Trainer` that builds the instance/class dataset,
generates the missing class samples with the frozen model before the run, sets the
two-term loss, and turns DreamBooth's options (LoRA, text-encoder training, validation
images, memory options) into model arguments, optimizer groups and stock hook settings.
Stepping, mixed precision, checkpoints, logging, validation and the final pipeline
directory are hooks.
"""
import inspect
import os
from collections.abc import Mapping

import torch

from ..checkpoint.rng import get_rng_state, set_rng_state
from ..engine.arguments import import_custom_modules
from ..engine.builder import build_model
from ..data.resumable import ResumableBatchSampler, seed_everything
from ..errors import ConfigError
from ..registry import TRAINERS, closest_names
from ..engine.trainer import Trainer
from . import arguments
from .class_images import fill_class_samples
from .dataset import DreamBoothDataset, check_interpolation, collate_dreambooth
from .flags import DEFAULT_CHECKPOINT_INTERVAL, take_diffusers_flags, with_foreign_flags
from .loss import PriorPreservationLoss
from .validation import ValidationCollate, ValidationPrompts, check_validation

_DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16}

_TRAINER_ARGS = [name for name in inspect.signature(Trainer.__init__).parameters if name != 'self']


@TRAINERS.register_module(module_name=['dreambooth_diffusion', 'DreamBoothDiffusionTrainer'])
class DreamBoothDiffusionTrainer(Trainer):
    """DreamBooth: teach a text-to-image model a subject from a few images.

    Every keyword must be one of its arguments (or an MMCV config key): ``build_trainer`` takes
    no helper variables for it (``strict_arguments``), and ModelScope's argument names are
    refused with what to write instead (ModelScope's own trainer: ``'dreambooth-diffusion'``).

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
            work dir; None saves none). With LoRA it holds the adapter weights only.
        lora, train_text_encoder, tokenizer_max_length, snr_gamma, noise_offset,
            gradient_checkpointing: passed to the diffusers back-end (see
            :class:`~hookloop.dreambooth.DiffusersDreamBooth`); ``train_text_encoder`` with
            ``lora`` means LoRA adapters on the text encoder, as in diffusers' LoRA script.
        text_encoder_lr: the text encoder's learning rate when it trains (default: the
            optimizer's ``lr``).
        validation: ``dict(prompts=[...], every_n_iters=100, num_images=2,
            num_inference_steps=25, guidance_scale=7.5, seed=0)``: images every K iterations
            and at the end, under ``<work_dir>/validation/iter_<n>/`` and in the loggers.
        center_crop, random_flip: image augmentation as in diffusers' script (random crop
            by default).
        image_interpolation_mode: the resize filter, one of torchvision's seven names
            (``nearest``, ``nearest_exact``, ``bilinear``, ``bicubic``, ``box``, ``hamming``,
            ``lanczos``); default lanczos with ``lora`` (diffusers' LoRA script), bilinear
            otherwise (``train_dreambooth.py``).
        max_grad_norm: gradient clipping (diffusers' default 1.0; None: none), as the
            optimizer hook's ``grad_clip`` unless ``optimizer_config`` sets one.
        scale_lr: multiply the learning rates by batch size x accumulation x world size.
        pre_compute_text_embeddings: encode the instance and class prompts once and free
            the text encoder.
        use_8bit_adam: use ``bitsandbytes.optim.AdamW8bit``.
        train_dataloader: loader options such as ``dict(batch_size=2, num_workers=2)``; the
            dataset and collate function are the trainer's (default ``batch_size=1, shuffle=True``).
        **kwargs: every other :class:`~hookloop.engine.trainer.Trainer` argument (``optimizer``,
            ``max_iters``, ``optimizer_config=dict(precision='fp16')``, ``checkpoint_config``,
            ``resume_from``, ...). ``loss_fn`` is the trainer's own and may not be given.
            ``checkpoint_config`` defaults to ``save_frozen=False`` (only what trains is saved),
            and to a checkpoint every 500 iterations when not given (diffusers'
            ``--checkpointing_steps``; ``checkpoint_config=None``: none).
            ``optimizer_config=dict(precision='fp16'|'bf16')`` also casts the frozen weights.

    Flags of diffusers' ``train_dreambooth_lora.py`` that are not hookloop arguments either
    work with their meaning (``pretrained_model_name_or_path``, ``learning_rate``,
    ``max_train_steps``, ``checkpointing_steps``, ...) or are a ConfigError naming hookloop's spelling
    (:mod:`hookloop.dreambooth.flags`). With a seed, the global RNGs are used as that
    script uses them (docs/dreambooth.md, "Randomness").
    """

    strict_arguments = True

    @with_foreign_flags
    def __init__(self, model=None, instance_prompt=None, instance_data_dir=None, instance_data=None,
                 class_prompt=None, with_prior_preservation=False, prior_loss_weight=1.0,
                 num_class_images=100, class_data_dir=None, resolution=None, sample_batch_size=4,
                 pipeline_dir='pipeline', train_dataloader=None, lora=None, train_text_encoder=False,
                 text_encoder_lr=None, validation=None, center_crop=False, random_flip=False,
                 tokenizer_max_length=None, snr_gamma=None, noise_offset=0.0, max_grad_norm=1.0, scale_lr=False,
                 gradient_checkpointing=False, pre_compute_text_embeddings=False, use_8bit_adam=False,
                 image_interpolation_mode=None, **kwargs):
        given_checkpoint_config = 'checkpoint_config' in kwargs
        taken = take_diffusers_flags(kwargs, train_dataloader)
        train_dataloader = taken.get('train_dataloader', train_dataloader)
        if 'model' in taken:
            if model is not None:
                raise ConfigError('dreambooth_diffusion got both model and pretrained_model_name_or_path; give one')
            model = taken['model']
        if model is None:
            raise ConfigError('dreambooth_diffusion needs model= (a local pipeline directory, a model config dict '
                              'or a back-end module)')
        import_custom_modules(kwargs.get('custom_imports'))  # they may register the back-end the model config names
        if image_interpolation_mode is not None:
            check_interpolation(image_interpolation_mode)
        unknown = [key for key in kwargs if key not in _TRAINER_ARGS]
        if unknown:  # a clear error naming the argument and the closest of the trainer's own and Trainer's
            own = [n for n, p in inspect.signature(DreamBoothDiffusionTrainer.__init__).parameters.items()
                   if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != 'self']
            hint = closest_names(unknown[0], own + _TRAINER_ARGS)
            raise ConfigError(f'dreambooth_diffusion got an unexpected argument {unknown[0]!r}'
                              + (f'; did you mean {", ".join(map(repr, hint))}?' if hint else ''))
        if 'loss_fn' in kwargs:
            raise ConfigError('dreambooth_diffusion sets its own loss (instance + prior_loss_weight * prior); '
                              'do not pass loss_fn')
        # Everything that can be checked without loading a model is checked first.
        arguments.nonempty_prompt('instance_prompt', instance_prompt)
        instance_samples = arguments.instance_samples(instance_data_dir, instance_data)
        if not isinstance(with_prior_preservation, bool):
            raise ConfigError(f'dreambooth_diffusion with_prior_preservation must be True or False, '
                              f'got {with_prior_preservation!r}')
        if with_prior_preservation:
            if class_prompt is None:
                raise ConfigError('dreambooth_diffusion with_prior_preservation=True needs a class_prompt '
                                  "(the subject's class, e.g. 'a photo of dog')")
            arguments.nonempty_prompt('class_prompt', class_prompt)
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
        if validation is not None:
            validation = check_validation(validation)
            taken = sorted(k for k in ('val_dataloader', 'val_evaluator', 'evaluation') if kwargs.get(k) is not None)
            if taken:
                raise ConfigError(f'dreambooth_diffusion validation= runs its own validation loop; do not also '
                                  f'give {taken}')
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                          or max_grad_norm <= 0):
            raise ConfigError(f'dreambooth_diffusion max_grad_norm must be None or a positive number, '
                              f'got {max_grad_norm!r}')
        model = arguments.with_model_options(arguments.model_config(model), dict(
            lora=lora, train_text_encoder=train_text_encoder, tokenizer_max_length=tokenizer_max_length,
            snr_gamma=snr_gamma, noise_offset=noise_offset, gradient_checkpointing=gradient_checkpointing))
        arguments.check_resolution(resolution, arguments.static_scale_factor(model))

        seed = kwargs.get('seed')
        if isinstance(seed, int) and not isinstance(seed, bool):
            seed_everything(seed)  # as the base Trainer does before it builds a model
        model = build_model(model)
        # The RNG as it is after the model (and LoRA's random initialisation), as diffusers'
        # script leaves it: the Trainer seeds again when it starts; this state is put back after.
        after_model = get_rng_state() if isinstance(seed, int) and not isinstance(seed, bool) else None
        for needed in ('generate', 'save_sample', 'save_pretrained', 'vae_scale_factor'):
            if not hasattr(model, needed):
                raise ConfigError(f'dreambooth_diffusion: the model {type(model).__name__} has no {needed!r}; '
                                  'use TinyDiffusion, DiffusersDreamBooth or a module with the same interface')
        arguments.check_resolution(resolution, model.vae_scale_factor)
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
            resolution, getattr(model, 'sample_channels', 3), center_crop=center_crop, random_flip=random_flip,
            interpolation=image_interpolation_mode or self.default_interpolation(model))
        self._prepare_model(model, kwargs, pre_compute_text_embeddings)

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
        if validation is not None:
            kwargs['val_dataloader'] = dict(
                dataset=ValidationPrompts(validation['prompts'], validation['num_images'], validation['seed']),
                batch_size=validation['num_images'], shuffle=False,
                collate_fn=ValidationCollate(validation['num_inference_steps'], validation['guidance_scale']))
            kwargs['evaluation'] = dict(interval=validation['every_n_iters'], by_epoch=False)
            custom_hooks.append(dict(type='ValidationImagesHook', prompts=validation['prompts']))
        optimizer_config = kwargs.get('optimizer_config')
        if max_grad_norm is not None and (optimizer_config is None or isinstance(optimizer_config, Mapping)):
            optimizer_config = dict(optimizer_config or {})
            if optimizer_config.get('type') in (None, 'OptimizerHook', 'GradientCumulativeOptimizerHook',
                                                'Fp16OptimizerHook'):
                optimizer_config.setdefault('grad_clip', dict(max_norm=max_grad_norm))
            kwargs['optimizer_config'] = optimizer_config
        if not given_checkpoint_config and 'checkpoint_config' not in kwargs:  # diffusers: every 500 steps
            kwargs['checkpoint_config'] = dict(interval=DEFAULT_CHECKPOINT_INTERVAL, by_epoch=False)
        if isinstance(kwargs.get('checkpoint_config'), Mapping):
            kwargs['checkpoint_config'] = {'save_frozen': False, **kwargs['checkpoint_config']}
        optimizer = kwargs.get('optimizer')
        if scale_lr and not isinstance(optimizer, Mapping):
            raise ConfigError('dreambooth_diffusion scale_lr=True needs optimizer as a config dict with an lr')
        if isinstance(optimizer, Mapping) and scale_lr:
            optimizer = dict(optimizer)
            factor = loader['batch_size'] * arguments.cumulative_iters(kwargs.get('optimizer_config')) * \
                int(os.environ.get('WORLD_SIZE', 1))
            optimizer['lr'] = optimizer['lr'] * factor
            text_encoder_lr = text_encoder_lr * factor if text_encoder_lr else None
        if isinstance(optimizer, Mapping) and (text_encoder_lr is not None or use_8bit_adam):
            optimizer = arguments.optimizer_with_groups(optimizer, model, text_encoder_lr, use_8bit_adam)
        elif use_8bit_adam:
            raise ConfigError('dreambooth_diffusion use_8bit_adam=True needs optimizer as a config dict')
        if optimizer is not None:
            kwargs['optimizer'] = optimizer
        super().__init__(model, train_dataloader=loader, custom_hooks=custom_hooks,
                         loss_fn=PriorPreservationLoss(prior_loss_weight, with_prior_preservation), **kwargs)
        if after_model is not None:
            set_rng_state(after_model)
        sampler = getattr(self.train_dataloader, 'batch_sampler', None)
        if isinstance(sampler, ResumableBatchSampler):
            # torch's DataLoader draws its base seed from the global RNG at each epoch and a
            # shuffling RandomSampler one more (diffusers' script runs on those): do the same.
            sampler.global_rng_draws = 2 if sampler.shuffle else 1

    @staticmethod
    def default_interpolation(model):
        """diffusers' default resize filter: lanczos in the LoRA script, bilinear in the
        full fine-tuning one (``train_dreambooth.py``)."""
        return 'lanczos' if getattr(model, 'lora', None) is not None else 'bilinear'

    def _prepare_model(self, model, kwargs, pre_compute_text_embeddings):
        """Memory options that change the built model: frozen weights in the training
        precision, prompt embeddings computed once with the text encoder freed."""
        optimizer_config = kwargs.get('optimizer_config')
        precision = optimizer_config.get('precision') if isinstance(optimizer_config, Mapping) else None
        if precision in _DTYPES and hasattr(model, 'cast_frozen'):
            model.cast_frozen(_DTYPES[precision])
        if pre_compute_text_embeddings:
            if not hasattr(model, 'precompute_prompt_embeddings'):
                raise ConfigError('dreambooth_diffusion pre_compute_text_embeddings=True needs the diffusers back-end')
            prompts = [self.instance_prompt] + ([self.class_prompt] if self.with_prior_preservation else [])
            model.precompute_prompt_embeddings(prompts)

    def train(self):
        """Generate the missing class samples, then train as any Trainer does."""
        summary = getattr(self.model, 'training_summary', None)
        if summary:
            self.logger.info('dreambooth_diffusion trains: %s', summary)
        self.generate_class_images()
        return super().train()

    def generate_class_images(self):
        """Fill ``class_data_dir`` up to ``num_class_images`` samples drawn from the frozen
        model with the class prompt (:func:`~hookloop.dreambooth.class_images.fill_class_samples`:
        existing samples are reused, the global RNG is not touched, batches are split across ranks)."""
        if not self.with_prior_preservation:
            return
        fill_class_samples(self.model, self.class_data_dir, self.class_prompt, self.num_class_images, self.seed,
                           self.sample_batch_size, self.resolution, self.rank, self.world_size, self.logger)
        self.dreambooth_dataset.refresh_class_samples()
