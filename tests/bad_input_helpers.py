"""Registered user code that fails on purpose, for tests/test_bad_input.py configs."""
import torch
from torch import nn

from hookloop.hooks.base import Hook
from hookloop.registry import DATASETS, HOOKS, MODELS


@MODELS.register_module()
class VectorLossModel(nn.Module):
    """Returns a per-sample loss vector (a common slip: the mean was forgotten)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 1)

    def forward(self, x, y):
        return {'loss': self.linear(x).squeeze(1)[:4] ** 2}


@DATASETS.register_module()
class BrokenAt(torch.utils.data.Dataset):
    def __init__(self, bad, n=64):
        self.bad, self.n = bad, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if index == self.bad:
            raise KeyError(f'sample {index} is broken')
        return torch.zeros(64), 0


@HOOKS.register_module()
class FailingHook(Hook):
    def after_train_iter(self, trainer):
        if trainer.iter == 2:
            1 / 0
