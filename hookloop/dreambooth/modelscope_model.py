"""ModelScope's ``stable-diffusion`` model (the ``model`` section of a Stable Diffusion model
directory's ``configuration.json``), for ModelScope's ``dreambooth-diffusion`` and
``lora-diffusion`` trainers (``hookloop.compat.modelscope_diffusion``).

It is the diffusers back-end (:class:`~hookloop.dreambooth.DiffusersDreamBooth`: the UNet, VAE,
CLIP text encoder, tokenizer and scheduler of the directory) called as ModelScope calls its
model: ``forward(text=[captions], target=images)`` returns ``{'loss': ...}``, the denoising error
of the captioned images, with ModelScope's steps in ModelScope's order (VAE sample, noise,
timesteps from the global RNG; the captions tokenized as one batch). It also writes what
ModelScope's ``pipeline()`` loads back (:meth:`save_modelscope_pipeline`).
"""
import os

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..registry import MODELS
from .class_images import fill_class_samples
from .dataset import IMAGE_SUFFIXES, follow_umask, list_samples
from .diffusers_backend import DiffusersDreamBooth

# ModelScope's ``torch_type`` values (a dtype, or its name in a JSON configuration).
DTYPES = {'float32': torch.float32, 'fp32': torch.float32, 'float16': torch.float16, 'fp16': torch.float16,
          'half': torch.float16, 'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16}


def as_dtype(value, what='torch_type'):
    """``torch_type`` as a ``torch.dtype`` (None stays None)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).replace('torch.', '')
    if name not in DTYPES:
        raise ConfigError(f'{what} must be a torch dtype or one of {sorted(DTYPES)}, got {value!r}')
    return DTYPES[name]


@MODELS.register_module(module_name=['stable-diffusion', 'ModelScopeStableDiffusion'])
class ModelScopeStableDiffusion(DiffusersDreamBooth):
    """ModelScope's ``StableDiffusion`` model over a local model directory.

    Args:
        model_dir: the directory (``unet/ vae/ text_encoder/ tokenizer/ scheduler/`` and
            ``configuration.json``).
        lora_tune, dreambooth_tune: ModelScope's flags for what its trainers fine-tune; here
            they only say which trainer the directory is meant for (the trainer decides what trains).
        torch_type: the dtype of the frozen weights (the VAE, the text encoder and, with LoRA, the
            UNet's base weights); what trains stays float32. ModelScope casts every part.
        revision: ignored for a local directory, as in ModelScope.
        pretrained_model_name_or_path: ignored: the parts are loaded from ``model_dir``, as in
            ModelScope (the key names the hub model the directory came from).
        xformers_enable: must be False: diffusers' default attention (PyTorch SDPA) is used.
        lora_rank: LoRA adapters of this rank (alpha = rank) on the UNet's attention projections
            instead of training the UNet (the ``lora-diffusion`` trainer's ``lora_rank``).
    """

    def __init__(self, model_dir, lora_tune=False, dreambooth_tune=False, torch_type=None, revision=None,
                 pretrained_model_name_or_path=None, xformers_enable=False, lora_rank=None):
        if xformers_enable:
            raise ConfigError('stable-diffusion xformers_enable=True: not supported (diffusers\' default attention, '
                              'PyTorch SDPA, is memory-efficient already); set it to false')
        lora = None if lora_rank is None else dict(rank=lora_rank, alpha=lora_rank)
        super().__init__(model_dir, lora=lora)
        self.model_dir = os.fspath(model_dir)
        self.lora_tune, self.dreambooth_tune = bool(lora_tune), bool(dreambooth_tune)
        dtype = as_dtype(torch_type, 'stable-diffusion torch_type')
        if dtype is not None and dtype != torch.float32:
            self.cast_frozen(dtype)

    as_dtype = staticmethod(as_dtype)

    def forward(self, text='', target=None):
        """ModelScope's training step of the model: ``{'loss': mse(UNet output, noise or velocity)}``."""
        captions = [text] if isinstance(text, str) else list(text)
        with torch.no_grad():
            latents = self.vae.encode(target.to(self.vae.dtype)).latent_dist.sample()
            latents = latents * self.vae.config.scaling_factor
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (latents.shape[0],),
                                  device=latents.device).long()
        noisy = self.noise_scheduler.add_noise(latents, noise, timesteps)
        with torch.no_grad():
            states = self.text_encoder(self._tokens(captions, latents.device))[0]
        goal = self.training_target(latents, noise, timesteps)
        prediction = self.unet(noisy, timesteps, states).sample
        if prediction.shape[1] == 6:  # a UNet that also predicts the variance
            prediction = prediction.chunk(2, dim=1)[0]
        return {'loss': F.mse_loss(prediction.float(), goal.float(), reduction='mean')}

    def fill_class_images(self, directory, prompt, count, seed, batch_size=1, resolution=None, rank=0,
                          world_size=1, logger=None):
        """Generate the missing class images of ``prompt`` into ``directory``
        (:func:`~hookloop.dreambooth.class_images.fill_class_samples`)."""
        fill_class_samples(self, directory, prompt, count, seed, batch_size, resolution, rank, world_size, logger)

    @staticmethod
    def class_image_rows(directory, prompt, count):
        """The first ``count`` images of ``directory`` (by name) as rows with ``prompt`` as caption."""
        images = [path for path in list_samples(directory) if path.lower().endswith(IMAGE_SUFFIXES)][:count]
        if len(images) < count:
            raise ConfigError(f'class_data_dir {directory!r} holds {len(images)} images, {count} are needed '
                              '(num_class_images)')
        return [{'Target:FILE': path, 'Text': prompt} for path in images]

    def save_modelscope_pipeline(self, directory, safe_serialization=False, dtype=None):
        """What ModelScope's ``pipeline(task='text-to-image-synthesis', model=directory)`` loads
        (its ``DiffusionPipeline.from_pretrained(directory, use_safetensors=False)`` by
        default): the fine-tuned pipeline, every part in ``.bin`` files without
        ``safe_serialization`` — the text encoder's ``pytorch_model.bin`` written here, since
        transformers 5 writes only ``model.safetensors`` — or safetensors with it; the weights as
        ``dtype`` (default: as trained). The live model is left as it is."""
        pipe = self.pipeline()
        if dtype is not None:
            pipe = _cast_copy(pipe, dtype)
        pipe.save_pretrained(directory, safe_serialization=safe_serialization)
        if not safe_serialization:
            _text_encoder_as_bin(pipe.text_encoder, os.path.join(directory, 'text_encoder'))
        follow_umask(directory)

    def save_modelscope_lora(self, directory, safe_serialization=False, dtype=None):
        """The LoRA adapters as ModelScope's ``lora-diffusion`` writes them into ``output/``:
        ``pytorch_lora_weights.bin`` (``.safetensors`` with ``safe_serialization``), in
        diffusers' format, which ``pipe.load_lora_weights(directory, weight_name=...)`` loads."""
        self.save_lora_weights(directory, safe_serialization, dtype)


def _cast_copy(pipe, dtype):
    """The pipeline with copies of its weights in ``dtype`` (the trained modules stay as they are)."""
    import copy
    parts = {name: (copy.deepcopy(part).to(dtype=dtype) if isinstance(part, torch.nn.Module) else part)
             for name, part in pipe.components.items()}
    copied = type(pipe)(**parts)
    copied.set_progress_bar_config(disable=True)
    return copied


def _text_encoder_as_bin(text_encoder, folder):
    """Replace the text encoder's safetensors files by ``pytorch_model.bin`` (a plain state dict,
    which ``torch.load(weights_only=True)`` reads)."""
    state = {k: v.detach().cpu().contiguous() for k, v in text_encoder.state_dict().items()}
    torch.save(state, os.path.join(folder, 'pytorch_model.bin'))
    for name in os.listdir(folder):
        if name.startswith('model') and (name.endswith('.safetensors') or name.endswith('.safetensors.index.json')):
            os.remove(os.path.join(folder, name))
