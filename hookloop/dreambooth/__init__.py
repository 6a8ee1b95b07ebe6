"""DreamBooth fine-tuning: the ``dreambooth_diffusion`` trainer and its two back-ends.

Importing this package registers ``dreambooth_diffusion`` in ``TRAINERS``, the back-ends
``TinyDiffusion``, ``DiffusersDreamBooth`` and ModelScope's ``stable-diffusion``
(``ModelScopeStableDiffusion``) in ``MODELS``, ``ImageCaptionRows`` in ``DATASETS`` and ``SavePipelineHook`` and
``ValidationImagesHook`` in ``HOOKS``. diffusers, transformers and peft are imported only
when the diffusers back-end is built.

A back-end is an ``nn.Module`` with: ``forward(pixel_values, prompts) -> {'model_pred',
'target'}`` (and for validation images ``forward(prompts=..., seeds=...) -> {'images'}``);
``generate(prompts, generator=None, resolution=None)`` -> samples in [-1, 1];
``save_sample(sample, path_stem)``; ``save_pretrained(directory)``; ``vae_scale_factor``;
and optionally ``resolution``, ``sample_channels`` and ``fixed_resolution``.

May import: ``engine`` and everything below it; not ``compat``, ``commands`` or ``cli``.
"""
from .dataset import DreamBoothDataset, collate_dreambooth
from .diffusers_backend import DiffusersDreamBooth
from .image_rows import ImageCaptionRows
from .loss import PriorPreservationLoss
from .modelscope_model import ModelScopeStableDiffusion
from .noise_schedule import DDPMSchedule
from .save_pipeline_hook import SavePipelineHook
from .validation import ValidationImagesHook
from .tiny import TinyDiffusion
from .toy import ToyClassSamples, ToySubjectSamples, pretrain_toy_model
from .trainer import DreamBoothDiffusionTrainer

__all__ = ['DreamBoothDiffusionTrainer', 'DreamBoothDataset', 'collate_dreambooth', 'DiffusersDreamBooth',
           'PriorPreservationLoss', 'DDPMSchedule', 'ImageCaptionRows', 'ModelScopeStableDiffusion', 'SavePipelineHook', 'ValidationImagesHook', 'TinyDiffusion', 'ToyClassSamples',
           'ToySubjectSamples', 'pretrain_toy_model']
