"""The diffusers back-end: Stable Diffusion's UNet, VAE and CLIP text encoder loaded
from a local pipeline directory (``pretrained_model_name_or_path``).

Needs the ``dreambooth`` extra (``pip install hookloop[dreambooth]``). Only the UNet
is trained; the VAE and the text encoder are frozen and kept in eval mode.
"""
import json
import os

import torch
from torch import nn

from ..errors import ConfigError
from ..registry import MODELS
from .dataset import tensor_to_image

_PARTS = ('unet', 'vae', 'text_encoder', 'tokenizer', 'scheduler')


def _import_diffusers():
    try:
        import diffusers
        import transformers
    except ImportError as exc:
        raise ConfigError(f'DiffusersDreamBooth needs diffusers and transformers '
                          f'(pip install "hookloop[dreambooth]"): {exc}') from None
    return diffusers, transformers


def _check_directory(path):
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        raise ConfigError(f'DiffusersDreamBooth pretrained_model_name_or_path {path!r} is not a local '
                          'directory (download the pipeline first, e.g. with huggingface-cli download)')
    missing = [part for part in _PARTS if not os.path.isdir(os.path.join(path, part))]
    if missing:
        raise ConfigError(f'DiffusersDreamBooth pretrained_model_name_or_path {os.fspath(path)!r} lacks the '
                          f'sub-folders {missing} of a Stable Diffusion pipeline')
    return os.fspath(path)


@MODELS.register_module()
class DiffusersDreamBooth(nn.Module):
    """Stable Diffusion parts for DreamBooth.

    Args:
        pretrained_model_name_or_path: a local diffusers pipeline directory with ``unet``,
            ``vae``, ``text_encoder``, ``tokenizer`` and ``scheduler`` sub-folders.
        revision, variant: passed to ``from_pretrained`` (e.g. ``variant='fp16'``).
        num_inference_steps, guidance_scale: used when generating class images.

    Calling it with ``pixel_values`` (images in [-1, 1]) and ``prompts`` encodes the images
    with the VAE, adds noise at random timesteps (global RNG) and returns
    ``{'model_pred': UNet output, 'target': noise or velocity}`` as the scheduler's
    ``prediction_type`` says.
    """

    sample_file_suffix = '.png'
    fixed_resolution = False
    sample_channels = 3

    def __init__(self, pretrained_model_name_or_path, revision=None, variant=None, num_inference_steps=50,
                 guidance_scale=7.5):
        super().__init__()
        diffusers, transformers = _import_diffusers()
        path = _check_directory(pretrained_model_name_or_path)
        options = dict(revision=revision, variant=variant, local_files_only=True)
        self.path = path
        self.tokenizer = transformers.CLIPTokenizer.from_pretrained(path, subfolder='tokenizer', revision=revision)
        self.text_encoder = transformers.CLIPTextModel.from_pretrained(path, subfolder='text_encoder', **options)
        self.vae = diffusers.AutoencoderKL.from_pretrained(path, subfolder='vae', **options)
        self.unet = diffusers.UNet2DConditionModel.from_pretrained(path, subfolder='unet', **options)
        # Training noise follows the pipeline's own scheduler config; sampling uses its class.
        self.noise_scheduler = diffusers.DDPMScheduler.from_pretrained(path, subfolder='scheduler')
        self.inference_scheduler = self._scheduler_class(diffusers, path).from_pretrained(path, subfolder='scheduler')
        for frozen in (self.vae, self.text_encoder):
            frozen.requires_grad_(False)
            frozen.eval()
        self.num_inference_steps, self.guidance_scale = num_inference_steps, guidance_scale
        self._prompt_cache = {}

    @staticmethod
    def _scheduler_class(diffusers, path):
        try:
            with open(os.path.join(path, 'model_index.json'), encoding='utf-8') as f:
                name = json.load(f)['scheduler'][1]
            return getattr(diffusers, name)
        except (OSError, KeyError, IndexError, TypeError, AttributeError, ValueError):
            return diffusers.DDPMScheduler

    @staticmethod
    def scale_factor_from_config(cfg):
        """The VAE factor from ``vae/config.json``, read before any weights are loaded."""
        path = _check_directory(cfg.get('pretrained_model_name_or_path'))
        try:
            with open(os.path.join(path, 'vae', 'config.json'), encoding='utf-8') as f:
                return 2 ** (len(json.load(f)['block_out_channels']) - 1)
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f'DiffusersDreamBooth: cannot read {path}/vae/config.json: {exc}') from None

    @property
    def vae_scale_factor(self):
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def resolution(self):
        """The UNet's native image size."""
        return self.unet.config.sample_size * self.vae_scale_factor

    def train(self, mode=True):
        super().train(mode)
        self.vae.eval()
        self.text_encoder.eval()
        return self

    def load_state_dict(self, *args, **kwargs):
        self._prompt_cache.clear()
        return super().load_state_dict(*args, **kwargs)

    def encode_prompts(self, prompts, device):
        """CLIP hidden states per prompt. The text encoder is frozen and a DreamBooth run
        has two prompts, so each is encoded once and cached (per device and autocast state)."""
        autocast = torch.is_autocast_enabled(device.type)
        states = []
        for prompt in prompts:
            key = (prompt, str(device), autocast)
            if key not in self._prompt_cache:
                ids = self.tokenizer(prompt, padding='max_length', max_length=self.tokenizer.model_max_length,
                                     truncation=True, return_tensors='pt').input_ids.to(device)
                with torch.no_grad():
                    self._prompt_cache[key] = self.text_encoder(ids)[0]
            states.append(self._prompt_cache[key])
        return torch.cat(states)

    def forward(self, pixel_values, prompts):
        with torch.no_grad():
            latents = self.vae.encode(pixel_values.to(self.vae.dtype)).latent_dist.sample()
            latents = latents * self.vae.config.scaling_factor
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (latents.shape[0],),
                                  device=latents.device)
        noisy = self.noise_scheduler.add_noise(latents, noise, timesteps)
        prediction = self.unet(noisy, timesteps, self.encode_prompts(prompts, latents.device)).sample
        kind = self.noise_scheduler.config.prediction_type
        if kind == 'epsilon':
            target = noise
        elif kind == 'v_prediction':
            target = self.noise_scheduler.get_velocity(latents, noise, timesteps)
        else:
            raise ConfigError(f'DiffusersDreamBooth: unsupported scheduler prediction_type {kind!r}')
        return {'model_pred': prediction, 'target': target}

    def pipeline(self):
        """A ``StableDiffusionPipeline`` over the current parts (the UNet as trained)."""
        diffusers, _ = _import_diffusers()
        pipe = diffusers.StableDiffusionPipeline(
            vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer, unet=self.unet,
            scheduler=self.inference_scheduler, safety_checker=None, feature_extractor=None,
            requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @torch.no_grad()
    def generate(self, prompts, generator=None, resolution=None):
        """Images in [-1, 1], ``(N, 3, H, W)``, one per prompt."""
        resolution = resolution or self.resolution
        images = self.pipeline()(list(prompts), height=resolution, width=resolution,
                                 num_inference_steps=self.num_inference_steps, guidance_scale=self.guidance_scale,
                                 generator=generator, output_type='pt').images
        return images * 2 - 1

    def save_sample(self, sample, path_stem):
        path = path_stem + self.sample_file_suffix
        tensor_to_image(sample).save(path)
        return path

    def save_pretrained(self, directory):
        """A diffusers pipeline directory (safetensors weights) that
        ``StableDiffusionPipeline.from_pretrained(directory)`` loads."""
        self.pipeline().save_pretrained(directory, safe_serialization=True)
