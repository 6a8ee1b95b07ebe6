"""``pipeline(task='text-to-image-synthesis', model=DIR)``: ModelScope's Stable Diffusion
pipeline for a local directory, so the end of ModelScope's DreamBooth and LoRA examples runs
(``pipe({'text': prompt})['output_imgs'][0]``).

As ModelScope's ``diffusers-stable-diffusion`` pipeline: ``DIR/configuration.json`` names the task
and the pipeline type; the weights load with ``DiffusionPipeline.from_pretrained(DIR,
use_safetensors=False)`` in ``torch_type`` (``.bin`` files unless ``use_safetensors=True``);
images come back as BGR ``uint8`` arrays (OpenCV's order). ``lora_dir`` loads LoRA weights with
diffusers' ``load_lora_weights`` (ModelScope calls ``unet.load_attn_procs``, which current
diffusers keeps for Custom Diffusion weights only).
"""
import json
import os

from ..errors import ConfigError

TASK = 'text-to-image-synthesis'
PIPELINE_TYPE = 'diffusers-stable-diffusion'
_CALL_DEFAULTS = dict(height=None, width=None, num_inference_steps=50, guidance_scale=7.5, negative_prompt=None,
                      num_images_per_prompt=1, eta=0.0, generator=None, latents=None)


def pipeline(task=None, model=None, lora_dir=None, model_revision=None, use_safetensors=False, torch_type=None,
             device=None, **kwargs):
    """The text-to-image pipeline of the local model directory ``model`` (see the module docstring).
    ``model_revision`` has no meaning for a local directory (ignored, as in ModelScope)."""
    if task not in (None, TASK):
        raise ConfigError(f'pipeline: task {task!r} is not supported (hookloop runs {TASK!r} pipelines only)')
    if kwargs:
        raise ConfigError(f'pipeline: unexpected arguments {sorted(kwargs)} (known: task, model, lora_dir, '
                          'model_revision, use_safetensors, torch_type, device)')
    path = os.fspath(model) if model is not None else None
    if path is None or not os.path.isdir(path):
        raise ConfigError(f'pipeline: model {model!r} is not a local directory; download it first and pass the '
                          'directory')
    configuration = os.path.join(path, 'configuration.json')
    if os.path.isfile(configuration):
        with open(configuration, encoding='utf-8') as f:
            cfg = json.load(f)
        kind = (cfg.get('pipeline') or {}).get('type')
        if cfg.get('task') not in (None, TASK) or kind not in (None, PIPELINE_TYPE):
            raise ConfigError(f'pipeline: {configuration} describes task {cfg.get("task")!r} / pipeline {kind!r}, '
                              f'not {TASK!r} / {PIPELINE_TYPE!r}')
    return StableDiffusionPipeline(path, lora_dir, use_safetensors, torch_type, device)


class StableDiffusionPipeline:
    """``pipe({'text': prompt, ...}) -> {'output_imgs': [BGR uint8 array, ...]}``; the other keys
    (``height``, ``width``, ``num_inference_steps`` (50), ``guidance_scale`` (7.5),
    ``negative_prompt``, ``num_images_per_prompt``, ``eta``, ``generator``, ``latents``) go to the
    diffusers pipeline."""

    def __init__(self, model_dir, lora_dir=None, use_safetensors=False, torch_type=None, device=None):
        import torch
        from diffusers import DiffusionPipeline
        self.pipeline = DiffusionPipeline.from_pretrained(model_dir, use_safetensors=use_safetensors,
                                                          dtype=torch_type or torch.float32)
        self.pipeline.set_progress_bar_config(disable=True)
        self.pipeline.to(device or ('cuda' if torch.cuda.is_available() else 'cpu'))
        if lora_dir is not None:
            if not os.path.isdir(lora_dir):
                raise ConfigError(f'pipeline: lora_dir {lora_dir!r} does not exist')
            names = [n for n in ('pytorch_lora_weights.safetensors', 'pytorch_lora_weights.bin')
                     if os.path.isfile(os.path.join(lora_dir, n))]
            if not names:
                raise ConfigError(f'pipeline: lora_dir {lora_dir!r} holds no pytorch_lora_weights.safetensors/.bin')
            self.pipeline.load_lora_weights(lora_dir, weight_name=names[0])

    def __call__(self, inputs):
        import numpy as np
        if not isinstance(inputs, dict) or 'text' not in inputs:
            raise ConfigError(f'pipeline input must be a dict with a "text", got {inputs!r}')
        options = {key: inputs.get(key, default) for key, default in _CALL_DEFAULTS.items()}
        images = self.pipeline(prompt=inputs['text'], output_type='pil', **options).images
        return {'output_imgs': [np.ascontiguousarray(np.array(image.convert('RGB'))[:, :, ::-1]) for image in images]}


__all__ = ['pipeline', 'StableDiffusionPipeline']
