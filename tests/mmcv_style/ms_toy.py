"""A ModelScope-style model and dataset (dict batches with ``labels``; outputs with ``loss`` and ``logits``)."""
import torch
from torch import nn

from hookloop import DATASETS, MODELS


@DATASETS.register_module(force=True)
class ToySequenceClassification:
    def __init__(self, split='train', size=40):
        generator = torch.Generator().manual_seed(0 if split == 'train' else 1)
        self.x = torch.randn(size, 6, generator=generator)
        self.labels = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {'input': self.x[index], 'labels': self.labels[index]}


@MODELS.register_module(force=True)
class ToyTextClassifier(nn.Module):
    def __init__(self, num_labels=2, hidden=8):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, hidden), nn.Tanh())
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input, labels=None):
        logits = self.classifier(self.encoder(input))
        outputs = {'logits': logits}
        if labels is not None:
            outputs['loss'] = nn.functional.cross_entropy(logits, labels)
        return outputs
