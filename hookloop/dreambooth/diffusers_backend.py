"""The diffusers back-end: Stable Diffusion's UNet, VAE and CLIP text encoder loaded
from a local pipeline directory (``pretrained_model_name_or_path``).

Needs the ``dreambooth`` extra (``pip install hookloop[dreambooth]``). What is trained:
the UNet (default), LoRA adapters in the UNet (and text encoder) instead (``lora=``), and
the text encoder too (``train_text_encoder=True``). The VAE is always frozen, in eval mode.
"""
import json
import os
from collections.abc import Mapping

import torch
from torch import nn

from ..errors import ConfigError
from ..registry import MODELS
from .dataset import follow_umask, tensor_to_image

_PARTS = ('unet', 'vae', 'text_encoder', 'tokenizer', 'scheduler')
UNET_LORA_TARGETS = ('to_q', 'to_k', 'to_v', 'to_out.0')  # diffusers' attention projections
TEXT_LORA_TARGETS = ('q_proj', 'k_proj', 'v_proj', 'out_proj')  # CLIP's, as diffusers' LoRA script
LORA_KEYS = ('rank', 'alpha', 'target_modules', 'dropout', 'text_encoder')


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



def check_lora(lora):
    """``lora=`` as a full dict (defaults filled), or None; refuses unknown keys and bad values."""
    if lora is None or lora is False:
        return None
    if lora is True:
        lora = {}
    if not isinstance(lora, Mapping):
        raise ConfigError(f'DiffusersDreamBooth lora must be a dict like dict(rank=4, alpha=4), got {lora!r}')
    unknown = sorted(set(lora) - set(LORA_KEYS))
    if unknown:
        raise ConfigError(f'DiffusersDreamBooth lora got unknown keys {unknown}; known: {list(LORA_KEYS)}')
    lora = dict(dict(rank=4, alpha=None, target_modules=None, dropout=0.0, text_encoder=False), **lora)
    if isinstance(lora['rank'], bool) or not isinstance(lora['rank'], int) or lora['rank'] < 1:
        raise ConfigError(f"DiffusersDreamBooth lora rank must be a positive int, got {lora['rank']!r}")
    lora['alpha'] = lora['rank'] if lora['alpha'] is None else lora['alpha']
    if isinstance(lora['alpha'], bool) or not isinstance(lora['alpha'], (int, float)) or lora['alpha'] <= 0:
        raise ConfigError(f"DiffusersDreamBooth lora alpha must be a positive number, got {lora['alpha']!r}")
    if not isinstance(lora['dropout'], (int, float)) or not 0 <= lora['dropout'] < 1:
        raise ConfigError(f"DiffusersDreamBooth lora dropout must be in [0, 1), got {lora['dropout']!r}")
    return lora


def _lora_config(lora, targets):
    from peft import LoraConfig
    # Gaussian A, zero B (as diffusers' LoRA scripts): the adapted model starts as the base.
    return LoraConfig(r=lora['rank'], lora_alpha=lora['alpha'], lora_dropout=lora['dropout'],
                      init_lora_weights='gaussian', target_modules=list(targets))


@MODELS.register_module()
class DiffusersDreamBooth(nn.Module):
    """Stable Diffusion parts for DreamBooth.

    Args:
        pretrained_model_name_or_path: a local diffusers pipeline directory with ``unet``,
            ``vae``, ``text_encoder``, ``tokenizer`` and ``scheduler`` sub-folders.
        revision, variant: passed to ``from_pretrained`` (e.g. ``variant='fp16'``).
        num_inference_steps, guidance_scale: used when generating class images.
        lora: ``dict(rank=4, alpha=rank, target_modules=None, dropout=0.0, text_encoder=False)``
            trains LoRA adapters (peft) instead of the UNet: only they have ``requires_grad``.
            ``target_modules=None`` means the UNet attention projections ``to_q, to_k, to_v,
            to_out.0``; ``text_encoder=True`` adapts CLIP's ``q/k/v/out_proj`` too.
        train_text_encoder: also fine-tune the whole text encoder (prompts are then encoded
            every step, with gradients); with ``lora``, LoRA adapters on the text encoder
            instead (diffusers' LoRA script's ``--train_text_encoder``).
        tokenizer_max_length: prompt tokens (default the tokenizer's ``model_max_length``).
        snr_gamma: min-SNR loss weighting (Hang et al., 2023): each instance sample's error is
            weighted by ``min(SNR, gamma) / SNR`` (epsilon) or ``/ (SNR + 1)`` (v-prediction).
        noise_offset: adds ``noise_offset * N(0, 1)`` per sample and channel to the noise.
        gradient_checkpointing: on the UNet, and on the text encoder when it is trained.

    Calling it with ``pixel_values`` (images in [-1, 1]) and ``prompts`` encodes the images
    with the VAE, adds noise at random timesteps (global RNG) and returns
    ``{'model_pred': UNet output, 'target': noise or velocity}`` as the scheduler's
    ``prediction_type`` says, plus ``sample_weight`` (per sample) with ``snr_gamma``.
    Calling it with ``prompts`` and ``seeds`` (a validation batch) generates one image per
    prompt from its own seeded generator: ``{'images': (N, 3, H, W) in [-1, 1]}``.
    """

    sample_file_suffix = '.png'
    fixed_resolution = False
    sample_channels = 3

    def __init__(self, pretrained_model_name_or_path, revision=None, variant=None, num_inference_steps=50,
                 guidance_scale=7.5, lora=None, train_text_encoder=False, tokenizer_max_length=None,
                 snr_gamma=None, noise_offset=0.0, gradient_checkpointing=False):
        super().__init__()
        diffusers, transformers = _import_diffusers()
        path = _check_directory(pretrained_model_name_or_path)
        self.lora = check_lora(lora)
        if self.lora is not None and train_text_encoder:
            # diffusers' LoRA script: --train_text_encoder means LoRA adapters on the text encoder.
            self.lora['text_encoder'], train_text_encoder = True, False
        if snr_gamma is not None and (isinstance(snr_gamma, bool) or not isinstance(snr_gamma, (int, float))
                                      or snr_gamma <= 0):
            raise ConfigError(f'DiffusersDreamBooth snr_gamma must be None or a positive number, got {snr_gamma!r}')
        if isinstance(noise_offset, bool) or not isinstance(noise_offset, (int, float)) or noise_offset < 0:
            raise ConfigError(f'DiffusersDreamBooth noise_offset must be a number >= 0, got {noise_offset!r}')
        options = dict(revision=revision, variant=variant, local_files_only=True)
        self.path, self.load_options = path, options
        self.tokenizer = transformers.CLIPTokenizer.from_pretrained(path, subfolder='tokenizer', revision=revision)
        text_encoder = transformers.CLIPTextModel.from_pretrained(path, subfolder='text_encoder', **options)
        vae = diffusers.AutoencoderKL.from_pretrained(path, subfolder='vae', **options)
        # The UNet is registered first, so its parameters come first in the optimizer and in the
        # gradient-clipping norm, as in diffusers' scripts (the norm's sum order is bitwise visible).
        self.unet = diffusers.UNet2DConditionModel.from_pretrained(path, subfolder='unet', **options)
        self.text_encoder, self.vae = text_encoder, vae
        # Training noise follows the pipeline's own scheduler config; sampling uses its class.
        self.noise_scheduler = diffusers.DDPMScheduler.from_pretrained(path, subfolder='scheduler')
        self.inference_scheduler = self._scheduler_class(diffusers, path).from_pretrained(path, subfolder='scheduler')
        self.train_text_encoder = bool(train_text_encoder)
        self.vae.requires_grad_(False)
        self.text_encoder.requires_grad_(self.train_text_encoder)
        if self.lora is not None:
            self.unet.requires_grad_(False)
            self.unet.add_adapter(_lora_config(self.lora, self.lora['target_modules'] or UNET_LORA_TARGETS))
            if self.lora['text_encoder']:
                from peft import inject_adapter_in_model
                inject_adapter_in_model(_lora_config(self.lora, TEXT_LORA_TARGETS), self.text_encoder)
                for name, parameter in self.text_encoder.named_parameters():
                    parameter.requires_grad_('lora_' in name)
        if gradient_checkpointing:
            self.unet.enable_gradient_checkpointing()
            if self.text_encoder_trained:
                enable = getattr(self.text_encoder, 'activation_checkpointing_enable', None)  # transformers >= 5.x
                (enable or self.text_encoder.gradient_checkpointing_enable)()
        self.vae.eval()
        self.text_encoder.train(False)
        self.tokenizer_max_length = tokenizer_max_length or self.tokenizer.model_max_length
        self.snr_gamma, self.noise_offset = snr_gamma, noise_offset
        self.num_inference_steps, self.guidance_scale = num_inference_steps, guidance_scale
        self._prompt_cache = {}
        self._precomputed = None  # prompt -> hidden states, once the text encoder is freed

    @property
    def training_summary(self):
        """What trains, in words (the trainer logs it at the start)."""
        if self.lora is not None:
            what = f"UNet LoRA adapters (rank {self.lora['rank']}, alpha {self.lora['alpha']})"
            return what + (' and text-encoder LoRA adapters' if self.lora['text_encoder'] else
                           '; the text encoder is frozen')
        if self.train_text_encoder:
            return 'the UNet and the whole text encoder (full fine-tuning)'
        return 'the whole UNet; the text encoder is frozen'

    @property
    def text_encoder_trained(self):
        """Whether any text-encoder weight trains (full fine-tune or LoRA)."""
        return self.text_encoder is not None and any(p.requires_grad for p in self.text_encoder.parameters())

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
        if self.text_encoder is not None:
            self.text_encoder.train(mode and self.text_encoder_trained)
        return self

    def load_state_dict(self, *args, **kwargs):
        self._prompt_cache.clear()
        return super().load_state_dict(*args, **kwargs)

    # -- memory options ----------------------------------------------------------------------
    def cast_frozen(self, dtype):
        """Cast the frozen weights (VAE, text encoder unless trained, the UNet's base weights
        under LoRA) to ``dtype``; trainable parameters stay float32 (as diffusers' scripts)."""
        for part in (self.vae, self.text_encoder, self.unet):
            if part is None:
                continue
            for parameter in part.parameters():
                if not parameter.requires_grad:
                    parameter.data = parameter.data.to(dtype)
            for module in part.modules():  # e.g. CLIP's position ids stay integers
                for name, buffer in module.named_buffers(recurse=False):
                    if buffer.is_floating_point() and not any(p.requires_grad for p in module.parameters(False)):
                        setattr(module, name, buffer.to(dtype))
        self._prompt_cache.clear()

    @torch.no_grad()
    def precompute_prompt_embeddings(self, prompts):
        """Encode ``prompts`` once and free the text encoder (``pre_compute_text_embeddings``).
        Only a frozen text encoder can be freed; it is reloaded from the base directory
        when a pipeline is needed (validation images, the final save)."""
        if self.text_encoder_trained:
            raise ConfigError('pre_compute_text_embeddings=True needs a frozen text encoder '
                              '(not train_text_encoder=True or lora text_encoder=True)')
        device = next(self.unet.parameters()).device
        self._precomputed = {prompt: self._encode(self.text_encoder, [prompt], device) for prompt in prompts}
        self.text_encoder = None

    def _tokens(self, prompts, device):
        return self.tokenizer(list(prompts), padding='max_length', max_length=self.tokenizer_max_length,
                              truncation=True, return_tensors='pt').input_ids.to(device)

    def _encode(self, text_encoder, prompts, device):
        return text_encoder(self._tokens(prompts, device))[0]

    def encode_prompts(self, prompts, device):
        """CLIP hidden states per prompt. A frozen text encoder's output for each prompt is
        computed once and cached (per device and autocast state: a run has two prompts); a
        trained one encodes every step, with gradients."""
        if self._precomputed is not None:
            missing = [p for p in prompts if p not in self._precomputed]
            if missing:
                raise ConfigError(f'pre_compute_text_embeddings: prompt {missing[0]!r} was not encoded before '
                                  'the text encoder was freed')
            return torch.cat([self._precomputed[p].to(device) for p in prompts])
        if self.text_encoder_trained:
            return self._encode(self.text_encoder, prompts, device)
        autocast = torch.is_autocast_enabled(device.type)
        states = []
        for prompt in prompts:
            key = (prompt, str(device), autocast)
            if key not in self._prompt_cache:
                with torch.no_grad():
                    self._prompt_cache[key] = self._encode(self.text_encoder, [prompt], device)
            states.append(self._prompt_cache[key])
        return torch.cat(states)

    def forward(self, pixel_values=None, prompts=None, seeds=None, num_inference_steps=None, guidance_scale=None):
        if seeds is not None:
            return {'images': self.generate_seeded(prompts, seeds, num_inference_steps, guidance_scale)}
        with torch.no_grad():
            latents = self.vae.encode(pixel_values.to(self.vae.dtype)).latent_dist.sample()
            latents = latents * self.vae.config.scaling_factor
        noise = torch.randn_like(latents)
        if self.noise_offset:  # https://www.crosslabs.org/blog/diffusion-with-offset-noise
            noise = noise + self.noise_offset * torch.randn(latents.shape[:2] + (1, 1), device=latents.device,
                                                            dtype=latents.dtype)
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (latents.shape[0],),
                                  device=latents.device)
        noisy = self.noise_scheduler.add_noise(latents, noise, timesteps)
        prediction = self.unet(noisy, timesteps, self.encode_prompts(prompts, latents.device)).sample
        outputs = {'model_pred': prediction, 'target': self.training_target(latents, noise, timesteps)}
        if self.snr_gamma is not None:
            outputs['sample_weight'] = min_snr_weights(self.noise_scheduler.alphas_cumprod, timesteps,
                                                     self.snr_gamma, self.noise_scheduler.config.prediction_type)
        return outputs

    def training_target(self, latents, noise, timesteps):
        """What the UNet learns to predict, as the scheduler's ``prediction_type`` says: the noise
        (``epsilon``) or the velocity (``v_prediction``)."""
        kind = self.noise_scheduler.config.prediction_type
        if kind == 'epsilon':
            return noise
        if kind == 'v_prediction':
            return self.noise_scheduler.get_velocity(latents, noise, timesteps)
        raise ConfigError(f'{type(self).__name__}: unsupported scheduler prediction_type {kind!r}')

    def pipeline(self):
        """A ``StableDiffusionPipeline`` over the current parts (the UNet as trained; a freed
        text encoder is loaded again from the base directory)."""
        diffusers, transformers = _import_diffusers()
        text_encoder = self.text_encoder
        if text_encoder is None:
            text_encoder = transformers.CLIPTextModel.from_pretrained(self.path, subfolder='text_encoder',
                                                                      **self.load_options)
            text_encoder.to(device=next(self.unet.parameters()).device, dtype=self.vae.dtype)
        pipe = diffusers.StableDiffusionPipeline(
            vae=self.vae, text_encoder=text_encoder, tokenizer=self.tokenizer, unet=self.unet,
            scheduler=self.inference_scheduler, safety_checker=None, feature_extractor=None,
            requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @torch.no_grad()
    def generate(self, prompts, generator=None, resolution=None, num_inference_steps=None, guidance_scale=None):
        """Images in [-1, 1], ``(N, 3, H, W)``, one per prompt."""
        resolution = resolution or self.resolution
        was_training = self.training
        self.eval()
        try:
            images = self.pipeline()(
                list(prompts), height=resolution, width=resolution,
                num_inference_steps=num_inference_steps or self.num_inference_steps,
                guidance_scale=self.guidance_scale if guidance_scale is None else guidance_scale,
                generator=generator, output_type='pt').images
        finally:
            self.train(was_training)
        return images * 2 - 1

    def generate_seeded(self, prompts, seeds, num_inference_steps=None, guidance_scale=None):
        """One image per prompt, image i drawn from ``torch.Generator().manual_seed(seeds[i])``."""
        from .validation import generate_seeded
        return generate_seeded(self.generate, prompts, seeds, next(self.unet.parameters()).device,
                               num_inference_steps=num_inference_steps, guidance_scale=guidance_scale)

    def save_sample(self, sample, path_stem):
        path = path_stem + self.sample_file_suffix
        tensor_to_image(sample).save(path)
        return path

    def save_pretrained(self, directory):
        """A diffusers pipeline directory (safetensors weights) that
        ``StableDiffusionPipeline.from_pretrained(directory)`` loads; with LoRA, the adapter
        weights and their config (rank, alpha, targets) that
        ``StableDiffusionPipeline.from_pretrained(base).load_lora_weights(directory)`` loads."""
        if self.lora is None:
            self.pipeline().save_pretrained(directory, safe_serialization=True)
            follow_umask(directory)
            return
        self.save_lora_weights(directory)

    def save_lora_weights(self, directory, safe_serialization=True, dtype=None):
        """The LoRA adapters in diffusers' format (``pytorch_lora_weights.safetensors``, or
        ``.bin`` without ``safe_serialization``), as ``dtype`` (default float32). The adapter
        config (rank, alpha, targets) goes into the safetensors metadata, without which a reload
        falls back to alpha = rank; a ``.bin`` file has no metadata."""
        from diffusers import StableDiffusionPipeline
        from diffusers.utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        def adapter(part):
            state = convert_state_dict_to_diffusers(get_peft_model_state_dict(part))
            return {k: v.detach().to(dtype or torch.float32).cpu().contiguous() for k, v in state.items()}

        def metadata(part):
            if not safe_serialization:
                return None
            config = part.peft_config['default'].to_dict()
            return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}

        text = self.lora['text_encoder']
        StableDiffusionPipeline.save_lora_weights(
            directory, unet_lora_layers=adapter(self.unet),
            text_encoder_lora_layers=adapter(self.text_encoder) if text else None,
            unet_lora_adapter_metadata=metadata(self.unet),
            text_encoder_lora_adapter_metadata=metadata(self.text_encoder) if text else None,
            safe_serialization=safe_serialization)
        follow_umask(directory)


def min_snr_weights(alphas_cumprod, timesteps, gamma, prediction_type):
    """Min-SNR-gamma loss weights per sample: ``SNR(t) = abar_t / (1 - abar_t)``, weight
    ``min(SNR, gamma) / SNR`` for epsilon targets, ``min(SNR, gamma) / (SNR + 1)`` for
    v-prediction (Hang et al., 2023, "Efficient Diffusion Training via Min-SNR Weighting")."""
    abar = alphas_cumprod.to(timesteps.device)[timesteps].float()
    snr = abar / (1 - abar)
    clipped = torch.clamp(snr, max=gamma)
    return clipped / (snr + 1) if prediction_type == 'v_prediction' else clipped / snr
