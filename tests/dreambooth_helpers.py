"""Shared DreamBooth test inputs: a tiny random pipeline and two fixed subject images."""
import torch

from hookloop import build_trainer


def subject_samples():
    """Two fixed 16x16 RGB samples in [-1, 1] (the same in every run of a test)."""
    return torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1


def dreambooth(work_dir, base, max_iters=2, **overrides):
    """A ``dreambooth_diffusion`` trainer on ``base`` (a saved random pipeline), logging every iteration."""
    args = dict(model=base, instance_data=subject_samples(), instance_prompt='a sks dog',
                optimizer=dict(type='AdamW', lr=1e-2), max_iters=max_iters, work_dir=str(work_dir), seed=0,
                device='cpu', log_config=dict(interval=1))
    args.update(overrides)
    return build_trainer('dreambooth_diffusion', default_args=args)
