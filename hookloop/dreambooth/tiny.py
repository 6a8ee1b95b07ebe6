"""The built-in tiny back-end: a small MLP denoiser over 8x8 images (or vectors),
conditioned on a frozen bag-of-words embedding "text encoder", with a DDPM schedule.

It runs on the CPU in seconds, which makes it the example and the acceptance test of
DreamBooth's prior preservation; its interface is the one the trainer expects of any
back-end (see :mod:`hookloop.dreambooth.backend`).
"""
import json
import math
import os
import zlib

import torch
from torch import nn

from ..errors import ConfigError
from ..registry import MODELS
from .dataset import follow_umask
from .noise_schedule import DDPMSchedule

CONFIG_NAME = 'tiny_diffusion.json'
WEIGHTS_NAME = 'tiny_diffusion.safetensors'


class TinyTextEncoder(nn.Module):
    """Words -> ids by a stable hash; a prompt's embedding is the sum of its words'
    embeddings. The table is drawn from ``seed`` and never trained."""

    def __init__(self, vocab_size=256, dim=16, seed=0):
        super().__init__()
        self.vocab_size = vocab_size
        table = torch.randn(vocab_size, dim, generator=torch.Generator().manual_seed(seed))
        self.embedding = nn.Embedding.from_pretrained(table, freeze=True)

    def token_ids(self, prompt):
        words = prompt.lower().split()
        if not words:
            raise ConfigError('TinyTextEncoder: a prompt must have at least one word, got an empty prompt')
        return torch.tensor([zlib.crc32(w.encode()) % self.vocab_size for w in words])

    def forward(self, prompt):
        ids = self.token_ids(prompt).to(self.embedding.weight.device)
        return self.embedding(ids).sum(dim=0)


def timestep_embedding(timesteps, dim, num_steps):
    """Sinusoidal features of ``timesteps / num_steps`` (as in the DDPM paper)."""
    half = dim // 2
    frequencies = torch.exp(-math.log(1000.0) * torch.arange(half, device=timesteps.device) / half)
    angles = (timesteps.float() / num_steps * 1000.0)[:, None] * frequencies[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class TinyDenoiser(nn.Module):
    """``eps(x_t, t, text)``: an MLP over the flattened sample, time and text features."""

    def __init__(self, sample_dim, text_dim=16, time_dim=16, hidden=128, num_steps=100):
        super().__init__()
        self.time_dim, self.num_steps = time_dim, num_steps
        self.net = nn.Sequential(
            nn.Linear(sample_dim + text_dim + time_dim, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, sample_dim))

    def forward(self, x_t, timesteps, text):
        features = torch.cat([x_t.flatten(1), text, timestep_embedding(timesteps, self.time_dim, self.num_steps)], 1)
        return self.net(features).view_as(x_t)


@MODELS.register_module()
class TinyDiffusion(nn.Module):
    """A text-conditioned DDPM small enough for CPU tests.

    Args:
        sample_shape: ``(channels, height, width)`` of an image, or ``(length,)`` of a vector.
        hidden: width of the denoiser MLP.
        text_dim: size of the frozen prompt embedding.
        vocab_size, text_seed: the hashed vocabulary and the seed of its embedding table.
        num_steps, beta_start, beta_end: the DDPM schedule.
        pretrained_model_name_or_path: a directory written by :meth:`save_pretrained`;
            its config replaces the arguments above.

    Calling it with ``pixel_values`` (samples in [-1, 1]) and ``prompts`` (one string per
    sample) draws timesteps and noise from the global RNG and returns
    ``{'model_pred': predicted noise, 'target': noise}``.
    """

    vae_scale_factor = 1  # no latent space: the resolution is the sample's size
    fixed_resolution = True  # an MLP over the flattened sample: one size only
    sample_file_suffix = '.safetensors'

    def __init__(self, sample_shape=(1, 8, 8), hidden=128, text_dim=16, vocab_size=256, text_seed=0,
                 num_steps=100, beta_start=1e-4, beta_end=0.2, pretrained_model_name_or_path=None):
        super().__init__()
        weights = None
        if pretrained_model_name_or_path is not None:
            config, weights = self._read_pretrained(pretrained_model_name_or_path)
            sample_shape, hidden, text_dim = config['sample_shape'], config['hidden'], config['text_dim']
            vocab_size, text_seed, num_steps = config['vocab_size'], config['text_seed'], config['num_steps']
            beta_start, beta_end = config['beta_start'], config['beta_end']
        sample_shape = tuple(sample_shape)
        if not sample_shape or not all(isinstance(s, int) and s > 0 for s in sample_shape) or len(sample_shape) > 3:
            raise ConfigError(f'TinyDiffusion sample_shape must be (C, H, W) or (length,), got {sample_shape!r}')
        self.config = dict(sample_shape=list(sample_shape), hidden=hidden, text_dim=text_dim, vocab_size=vocab_size,
                           text_seed=text_seed, num_steps=num_steps, beta_start=beta_start, beta_end=beta_end)
        self.sample_shape = sample_shape
        self.schedule = DDPMSchedule(num_steps, beta_start, beta_end)
        self.text_encoder = TinyTextEncoder(vocab_size, text_dim, text_seed)
        self.denoiser = TinyDenoiser(math.prod(sample_shape), text_dim, 16, hidden, num_steps)
        if weights is not None:
            self.load_state_dict(weights)

    @property
    def resolution(self):
        """The side of a square image sample; None for vectors."""
        return self.sample_shape[-1] if len(self.sample_shape) == 3 else None

    @property
    def sample_channels(self):
        return self.sample_shape[0] if len(self.sample_shape) == 3 else None

    def train(self, mode=True):
        super().train(mode)
        self.text_encoder.eval()  # frozen: always in inference mode
        return self

    def encode_prompts(self, prompts):
        """``(len(prompts), text_dim)``; each distinct prompt is encoded once."""
        positions = {}
        for prompt in prompts:
            positions.setdefault(prompt, len(positions))
        with torch.no_grad():
            table = torch.stack([self.text_encoder(p) for p in positions])
        if len(positions) == len(prompts):
            return table
        return table[torch.tensor([positions[p] for p in prompts], device=table.device)]

    def forward(self, pixel_values=None, prompts=None, seeds=None, num_inference_steps=None, guidance_scale=None):
        if seeds is not None:  # a validation batch (the tiny sampler has fixed steps, no guidance)
            from .validation import generate_seeded
            device = next(self.denoiser.parameters()).device
            return {'images': torch.cat([generate_seeded(self.generate, [prompt], [seed], device)
                                         for prompt, seed in zip(prompts, seeds)])}
        if tuple(pixel_values.shape[1:]) != self.sample_shape:
            raise ConfigError(f'TinyDiffusion expects samples of shape {self.sample_shape}, got '
                              f'{tuple(pixel_values.shape[1:])}')
        noise = torch.randn_like(pixel_values)
        timesteps = torch.randint(0, self.schedule.num_steps, (pixel_values.shape[0],), device=pixel_values.device)
        noisy = self.schedule.add_noise(pixel_values, noise, timesteps)
        return {'model_pred': self.predict_noise(noisy, timesteps, self.encode_prompts(prompts)), 'target': noise}

    def predict_noise(self, x_t, timesteps, text):
        """The MLP's output plus ``sqrt(1 - abar_t) * x_t``, the best linear guess of the noise
        for unit-variance data: the MLP learns a correction instead of the identity map it
        would otherwise have to learn at high noise levels."""
        skip = self.schedule.at(1 - self.schedule.alphas_cumprod, timesteps, x_t).sqrt()
        return self.denoiser(x_t, timesteps, text) + skip * x_t

    @torch.no_grad()
    def generate(self, prompts, generator=None, resolution=None):
        """Ancestral DDPM sampling: one sample in [-1, 1] (clamped) per prompt.

        ``generator`` (a CPU ``torch.Generator``) makes the samples reproducible without
        touching the global RNG (a list of generators: the first is used)."""
        if isinstance(generator, (list, tuple)):
            generator = generator[0]
        device = next(self.denoiser.parameters()).device
        text = self.encode_prompts(prompts)
        shape = (len(prompts), *self.sample_shape)
        x = torch.randn(shape, generator=generator).to(device)
        for t in reversed(range(self.schedule.num_steps)):
            eps = self.predict_noise(x, torch.full((len(prompts),), t, device=device), text)
            x = self.schedule.step(eps, t, x, torch.randn(shape, generator=generator).to(device))
        return x.clamp(-1, 1)

    # -- files -------------------------------------------------------------------------------
    def save_pretrained(self, directory):
        """Write the config (JSON) and the weights (safetensors) to ``directory``."""
        from safetensors.torch import save_file
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, CONFIG_NAME), 'w', encoding='utf-8') as f:
            json.dump(self.config, f, indent=2)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
                  os.path.join(directory, WEIGHTS_NAME))
        follow_umask(directory)

    @classmethod
    def from_pretrained(cls, directory):
        return cls(pretrained_model_name_or_path=directory)

    @staticmethod
    def _read_pretrained(directory):
        config_path = os.path.join(os.fspath(directory), CONFIG_NAME)
        if not os.path.isfile(config_path):
            raise ConfigError(f'TinyDiffusion pretrained_model_name_or_path {directory!r} has no {CONFIG_NAME} '
                              '(write one with TinyDiffusion.save_pretrained)')
        from safetensors.torch import load_file
        with open(config_path, encoding='utf-8') as f:
            config = json.load(f)
        return config, load_file(os.path.join(directory, WEIGHTS_NAME))

    def save_sample(self, sample, path_stem):
        """Store one generated sample exactly (no 8-bit rounding); returns the path."""
        from safetensors.torch import save_file
        path = path_stem + self.sample_file_suffix
        save_file({'sample': sample.detach().cpu().contiguous()}, path)
        return path
