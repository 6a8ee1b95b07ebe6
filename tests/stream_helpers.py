"""Streams and a model for the kill -9 resume tests of streams (``test_stream_resume_kill.py``),
registered so that config files run in subprocesses can name them. Every sample a dataset
yields is appended to ``read_log`` (one line each, from any process), so a test can count
how often data was read."""
import functools
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from hookloop.data.hf_dataset import HFDataset
from hookloop.registry import DATASETS, MODELS


def log_read(read_log, index, delay):
    if delay:
        time.sleep(delay)
    fd = os.open(read_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f'{index}\n'.encode())
    finally:
        os.close(fd)


def sample(index):
    x = torch.tensor([float(index % 7), float(index % 5) / 5, float(index % 3) - 1.0, 1.0])
    return x, (x * torch.arange(1.0, 5.0)).sum(0, keepdim=True)


@DATASETS.register_module()
class CountedSamples(Dataset):
    """Map-style: ``n`` samples (x, y)."""

    def __init__(self, read_log, n=24, delay=0.0):
        self.read_log, self.n, self.delay = read_log, n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        log_read(self.read_log, index, self.delay)
        return sample(index)


@DATASETS.register_module()
class CountedStream(IterableDataset):
    """A stateless stream of ``n`` samples (x, y) in order."""

    def __init__(self, read_log, n=24, delay=0.0):
        self.read_log, self.n, self.delay = read_log, n, delay

    def __iter__(self):
        for index in range(self.n):
            log_read(self.read_log, index, self.delay)
            yield sample(index)


def _logged(example, read_log, delay):
    log_read(read_log, example['id'], delay)
    return example


@DATASETS.register_module()
def CountedHFStream(data_files, read_log, delay=0.0, shuffle_buffer_size=None):
    """An HF streaming dataset from JSON lines, each example logged as it is yielded."""
    dataset = HFDataset('json', data_files=data_files, split='train', streaming=True, format=None,
                        shuffle_buffer_size=shuffle_buffer_size, shuffle_seed=3)
    return dataset.map(functools.partial(_logged, read_log=read_log, delay=delay)).with_format('torch')


def write_json_lines(path, n=24):
    import json
    with open(path, 'w') as f:
        for index in range(n):
            x, y = sample(index)
            f.write(json.dumps({'x': x.tolist(), 'y': y.tolist(), 'id': index}) + '\n')
    return str(path)


@MODELS.register_module()
class StreamRegressor(nn.Module):
    """``model(x, y)`` (or a dict batch with ``id``) -> MSE loss; dropout makes the torch RNG matter."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 1))

    def forward(self, x, y, id=None):
        return nn.functional.mse_loss(self.net(x), y)
