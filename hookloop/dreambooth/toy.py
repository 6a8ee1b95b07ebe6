"""Synthetic 8x8 "photos" for the tiny back-end: a few classes, each a pattern with
per-sample contrast and noise, and a "subject" with its own pattern. They make the
DreamBooth example and the language-drift test run on a CPU without any download."""
import torch
from torch.utils.data import Dataset

from ..errors import ConfigError
from ..registry import DATASETS, MODELS
from .tiny import TinyDiffusion


def toy_pattern(name, size=8):
    """The mean image of a toy class (``'dog'``, ``'cat'``, ``'car'``) or of the
    ``'subject'``, as ``(1, size, size)`` in [-1, 1]."""
    axis = torch.linspace(-1, 1, size)
    yy, xx = torch.meshgrid(axis, axis, indexing='ij')
    patterns = {
        'dog': 0.8 * xx,                                  # a left-to-right ramp
        'cat': 0.8 * yy,                                  # a top-to-bottom ramp
        'car': 0.6 * torch.sign(xx * yy),                 # four quadrants
        'subject': 0.9 - 1.6 * (xx ** 2 + yy ** 2).clamp(max=1),  # a bright disc
    }
    if name not in patterns:
        raise ConfigError(f'unknown toy pattern {name!r}; known: {sorted(patterns)}')
    return patterns[name].unsqueeze(0)


def toy_samples(name, count, seed=0, contrast=0.2, noise=0.1, size=8):
    """``count`` samples of pattern ``name``: ``pattern * (1 + contrast * a) + noise * n``."""
    generator = torch.Generator().manual_seed(seed)
    base = toy_pattern(name, size)
    scale = 1 + contrast * torch.randn(count, 1, 1, 1, generator=generator)
    return (base * scale + noise * torch.randn(count, *base.shape, generator=generator)).clamp(-1, 1)


@DATASETS.register_module()
class ToySubjectSamples(Dataset):
    """A few samples of the toy subject (tight around its pattern), as tensors."""

    def __init__(self, count=4, seed=1, noise=0.05):
        self.samples = toy_samples('subject', count, seed, contrast=0.05, noise=noise)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


@DATASETS.register_module()
class ToyClassSamples(Dataset):
    """Samples of one toy class, as tensors."""

    def __init__(self, name='dog', count=64, seed=2):
        self.samples = toy_samples(name, count, seed)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


@MODELS.register_module(module_name='ToyPretrainedTinyDiffusion')
def pretrain_toy_model(classes=('dog', 'cat', 'car'), steps=1500, batch_size=64, lr=3e-3, seed=0, hidden=128):
    """A :class:`TinyDiffusion` pretrained with a plain loop on ``'a <class>'`` prompts, the
    stand-in for a pretrained text-to-image model. Deterministic for a seed; uses its own
    generator for data and restores the global RNG afterwards."""
    state = torch.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = TinyDiffusion(sample_shape=(1, 8, 8), hidden=hidden)
        data = torch.cat([toy_samples(name, 512, seed=seed + i) for i, name in enumerate(classes)])
        prompts = [f'a {name}' for name in classes for _ in range(512)]
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
        for _ in range(steps):
            index = torch.randint(0, len(data), (batch_size,))
            out = model(data[index], [prompts[i] for i in index.tolist()])
            loss = torch.nn.functional.mse_loss(out['model_pred'], out['target'])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            schedule.step()
    finally:
        torch.set_rng_state(state)
    return model
