"""Shared test helpers: small deterministic data and models; the suite's own temp dir."""
import os
import shutil
import tempfile

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture(scope='session', autouse=True)
def suite_temp_dir(tmp_path_factory):
    """What the suite writes to "the temp dir" goes inside pytest's own base temp dir, and is
    removed when the session (an xdist worker) ends: ``tempfile`` in this process and ``TMPDIR``
    for the processes it starts (torchrun's ``torchelastic_*`` log dirs, the benches' work dirs,
    multiprocessing's ``pymp-*``, URL work dirs' local mirrors, torch.compile's cache). Other
    sessions' files in the system temp dir are never touched. Together with
    ``tmp_path_retention_policy = "failed"`` (pyproject.toml) a passing run leaves nothing."""
    directory = str(tmp_path_factory.mktemp('tmp'))
    # torch.compile's cache dir is pinned in TORCHINDUCTOR_CACHE_DIR at its first use, which an
    # import during collection may have made already: named here too
    variables = {'TMPDIR': directory, 'TORCHINDUCTOR_CACHE_DIR': os.path.join(directory, 'torchinductor')}
    previous_env, previous_tempdir = {name: os.environ.get(name) for name in variables}, tempfile.tempdir
    os.environ.update(variables)
    tempfile.tempdir = directory
    yield directory
    tempfile.tempdir = previous_tempdir
    for name, value in previous_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(directory, ignore_errors=True)


def regression_data(n=40, features=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = x @ torch.arange(1.0, features + 1) + 0.1 * torch.randn(n, generator=generator)
    return TensorDataset(x, y.unsqueeze(1))


class Regressor(nn.Module):
    """``model(x, y)`` -> mean squared error; ``model(x)`` -> predictions."""

    def __init__(self, features=4, hidden=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x, y=None):
        prediction = self.net(x)
        if y is None:
            return prediction
        return nn.functional.mse_loss(prediction, y)


def train_and_close(trainer):
    """Train, always release the trainer's log files, return the trainer."""
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


@pytest.fixture
def dataset():
    return regression_data()


@pytest.fixture
def make_loader(dataset):
    def make(batch_size=8, shuffle=False, **kwargs):
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **kwargs)
    return make


@pytest.fixture
def flush_every():
    """``flush_every(seconds)``: the log flusher's period for this test (a thread already waiting
    takes it at once); the previous one comes back after the test."""
    from hookloop.logging import flusher
    previous = flusher.FLUSH_SECONDS
    yield flusher.set_period
    flusher.set_period(previous)


@pytest.fixture
def mmcv_alias():
    """``import mmcv.X`` gives ``hookloop.compat.mmcv.X`` during the test (tests/mmcv_style/alias.py)."""
    from mmcv_style.alias import MMCVAlias
    alias = MMCVAlias().install()
    yield alias
    alias.remove()
