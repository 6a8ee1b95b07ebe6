"""Validation images: a fixed-seed generation every K iterations and at the end.

It is a validation loop like any other: the trainer's ``val_dataloader`` yields batches of
``{'prompts', 'seeds', 'num_inference_steps', 'guidance_scale'}``, the back-end's forward
generates one image per prompt from its own seeded generator, and
:class:`ValidationImagesHook` saves the PNGs under ``<work_dir>/validation/iter_<n>/`` and
publishes them to the logger hooks (:func:`hookloop.logging.images.publish_images`). Because it is a
validation loop, an ``EMAHook(swap=True)`` swaps the averaged weights in for it; generation
draws only from its own generators (and runs under ``torch.random.fork_rng``), so the
training RNG stream is the same with and without validation images.
"""
import os
import re

import torch
from torch.utils.data import Dataset

from ..dist.process_group import is_distributed
from ..errors import ConfigError
from ..hooks.base import Hook
from ..logging.images import as_uint8_hwc, publish_images
from ..priority import Priority
from ..registry import HOOKS

VALIDATION_KEYS = ('prompts', 'every_n_iters', 'num_images', 'num_inference_steps', 'guidance_scale', 'seed')


def check_validation(validation):
    """``validation=`` with its defaults filled in, or ConfigError naming the bad key."""
    if not isinstance(validation, dict):
        raise ConfigError(f'dreambooth_diffusion validation must be a dict like dict(prompts=[...], '
                          f'every_n_iters=100), got {validation!r}')
    unknown = sorted(set(validation) - set(VALIDATION_KEYS))
    if unknown:
        raise ConfigError(f'dreambooth_diffusion validation got unknown keys {unknown}; known: {list(VALIDATION_KEYS)}')
    options = dict(every_n_iters=100, num_images=2, num_inference_steps=25, guidance_scale=7.5, seed=0)
    options.update(validation)
    prompts = options.get('prompts')
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts or \
            not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ConfigError(f'dreambooth_diffusion validation prompts must be a non-empty list of prompts, '
                          f'got {options.get("prompts")!r}')
    options['prompts'] = list(prompts)
    for key in ('every_n_iters', 'num_images', 'num_inference_steps'):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f'dreambooth_diffusion validation {key} must be a positive int, got {value!r}')
    if isinstance(options['seed'], bool) or not isinstance(options['seed'], int):
        raise ConfigError(f"dreambooth_diffusion validation seed must be an int, got {options['seed']!r}")
    return options


class ValidationPrompts(Dataset):
    """Item ``(prompt i, image j)``: the prompt and the seed ``seed + j`` (every prompt gets
    the same seeds, so images of different prompts and iterations are comparable)."""

    def __init__(self, prompts, num_images, seed):
        self.prompts, self.num_images, self.seed = list(prompts), num_images, seed

    def __len__(self):
        return len(self.prompts) * self.num_images

    def __getitem__(self, index):
        return self.prompts[index // self.num_images], self.seed + index % self.num_images


class ValidationCollate:
    """Items of :class:`ValidationPrompts` -> one generation batch for the back-end's forward."""

    def __init__(self, num_inference_steps, guidance_scale):
        self.num_inference_steps, self.guidance_scale = num_inference_steps, guidance_scale

    def __call__(self, items):
        return {'prompts': [prompt for prompt, _ in items], 'seeds': [seed for _, seed in items],
                'num_inference_steps': self.num_inference_steps, 'guidance_scale': self.guidance_scale}


def generate_seeded(generate, prompts, seeds, device, **options):
    """``generate(prompts, generator=[...], **options)`` with one CPU generator per image,
    leaving the global RNGs (CPU and this device) as they were."""
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        return generate(list(prompts), generator=[torch.Generator().manual_seed(int(s)) for s in seeds], **options)


def prompt_slug(prompt):
    return re.sub(r'[^A-Za-z0-9]+', '_', prompt).strip('_')[:60] or 'prompt'


@HOOKS.register_module()
class ValidationImagesHook(Hook):
    """Collects the images of a validation loop, saves them and publishes them.

    Files: ``<work_dir>/<out_dir>/iter_<n>/<k>_<prompt>_seed<s>.png`` (n = training iterations
    completed, k = the prompt's position). Logger tag: ``validation/<k>_<prompt>``, one image
    per seed. Under several ranks the images are gathered on rank 0, which writes them.

    Args:
        prompts: the validation prompts (to number them in file names and tags).
        out_dir: relative to the work dir.
    """

    PRIORITY = Priority.LOW

    def __init__(self, prompts, out_dir='validation'):
        self.prompts, self.out_dir = list(prompts), out_dir
        self._collected = []

    def output_dirs(self, trainer):
        return {'image': os.path.join(trainer.work_dir, os.fspath(self.out_dir))}

    def before_val_epoch(self, trainer):
        self._collected = []

    def after_val_iter(self, trainer):
        images = trainer.val_outputs['images']
        batch = trainer.data_batch
        self._collected += [(prompt, int(seed), as_uint8_hwc(image))
                            for prompt, seed, image in zip(batch['prompts'], batch['seeds'], images)]

    def after_val_epoch(self, trainer):
        collected = self._collected
        if is_distributed():
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, collected)
            collected = [item for part in gathered for item in part]
        self._collected = []
        if trainer.rank != 0:
            return
        from PIL import Image
        _, completed, _ = trainer.position.resume_point()
        directory = os.path.join(trainer.work_dir, self.out_dir, f'iter_{completed}')
        os.makedirs(directory, exist_ok=True)
        unique = {(prompt, seed): image for prompt, seed, image in collected}  # wrapped-around copies
        for number, prompt in enumerate(self.prompts):
            name = f'{number}_{prompt_slug(prompt)}'
            seeds = sorted(seed for p, seed in unique if p == prompt)
            for seed in seeds:
                Image.fromarray(unique[prompt, seed]).save(os.path.join(directory, f'{name}_seed{seed}.png'))
            publish_images(trainer, f'validation/{name}', [unique[prompt, seed] for seed in seeds], completed)
        trainer.logger.info('saved %d validation images in %s', len(unique), directory)
