"""scikit-learn's bundled 8x8 digits (no download) and a small MLP classifier."""
import torch
from torch import nn
from torch.utils.data import Dataset

from ..errors import ConfigError
from ..registry import DATASETS, MODELS


@DATASETS.register_module()
class DigitsDataset(Dataset):
    """The 1,797 digits images as 64-float vectors in [0, 1], split reproducibly.

    Args:
        split: ``'train'`` or ``'val'``.
        val_fraction: share of the samples held out for ``'val'``.
        split_seed: seed of the shuffle that decides the split.
    """

    def __init__(self, split='train', val_fraction=0.2, split_seed=0):
        if split not in ('train', 'val'):
            raise ConfigError(f"DigitsDataset split must be 'train' or 'val', got {split!r}")
        from sklearn.datasets import load_digits
        digits = load_digits()
        images = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(split_seed))
        n_val = int(len(labels) * val_fraction)
        chosen = order[:n_val] if split == 'val' else order[n_val:]
        self.images, self.labels = images[chosen], labels[chosen]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]


@MODELS.register_module()
class DigitsMLP(nn.Module):
    """64 -> hidden -> hidden -> 10. Called with ``(images, labels)`` it returns
    ``{'loss': cross-entropy, 'logits': ...}``; with images only, the logits dict."""

    def __init__(self, hidden=64, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, images, labels=None):
        logits = self.net(images)
        outputs = {'logits': logits}
        if labels is not None:
            outputs['loss'] = nn.functional.cross_entropy(logits, labels)
        return outputs
