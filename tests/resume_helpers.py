"""Models and datasets for the checkpoint / resume tests, registered so that config files
written by the tests (run in subprocesses) can name them."""
import random
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from hookloop.registry import DATASETS, MODELS


@DATASETS.register_module()
class AugmentedRegression(Dataset):
    """Regression samples with a random augmentation drawn from torch, NumPy and Python's
    ``random`` (so every generator a user might use must be reproduced on resume).
    ``calls`` counts ``__getitem__`` in this process; ``delay`` slows each sample down."""

    def __init__(self, n=48, features=4, seed=0, delay=0.0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=generator)
        self.y = (self.x @ torch.arange(1.0, features + 1)).unsqueeze(1)
        self.delay = delay
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        noise = 0.05 * torch.randn(self.x.shape[1]) + 0.01 * float(np.random.rand()) + 0.01 * random.random()
        return self.x[index] + noise, self.y[index]


@MODELS.register_module()
class DropoutRegressor(nn.Module):
    """``model(x, y)`` -> MSE loss, with dropout so that the torch RNG matters in training.
    ``big`` adds a frozen buffer of that many float32 values (to make large checkpoints)."""

    def __init__(self, features=4, hidden=16, big=0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        if big:
            self.register_buffer('ballast', torch.zeros(big))

    def forward(self, x, y=None):
        prediction = self.net(x)
        if y is None:
            return prediction
        return nn.functional.mse_loss(prediction, y)


def assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f'{key} differs'
