"""An MMCV-1.x-style classifier and dataset, registered as user code would register them.

The model follows MMCV's model contract: ``forward(img, gt_label, return_loss=True)`` returns
several loss terms (``loss_cls`` and a list ``loss_aux``, no ``loss``), and with
``return_loss=False`` one result per sample. The dataset takes ``pipeline`` / ``data_root`` /
``img_norm_cfg``-style arguments and evaluates results with ``evaluate(results, metric=...)``.
"""
import torch
from torch import nn

from hookloop import DATASETS, MODELS


@DATASETS.register_module(force=True)
class ToyImageDataset:
    CLASSES = ('a', 'b')

    def __init__(self, data_root, pipeline, split='train', size=48, mean=(0.0,), std=(1.0,)):
        generator = torch.Generator().manual_seed(0 if split == 'train' else 1)
        self.images = torch.randn(size, 4, generator=generator)
        self.labels = (self.images.sum(1) > 0).long()
        self.pipeline, self.data_root = pipeline, data_root
        self.images = (self.images - mean[0]) / std[0]
        self.evaluated = []

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {'img': self.images[index], 'gt_label': self.labels[index]}

    def evaluate(self, results, metric='accuracy', logger=None, topk=1):
        assert metric == 'accuracy' and topk == 1 and logger is not None
        predicted = torch.stack([r.argmax() for r in results])
        self.evaluated.append(len(results))
        return {'accuracy': (predicted == self.labels[:len(results)]).float().mean().item() * 100}


@MODELS.register_module(force=True)
class ToyClassifier(nn.Module):
    def __init__(self, backbone, head, train_cfg=None, test_cfg=None):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, backbone['width']), nn.BatchNorm1d(backbone['width']), nn.ReLU())
        self.head = nn.Linear(backbone['width'], head['num_classes'])
        self.train_cfg, self.test_cfg = train_cfg, test_cfg

    def forward(self, img, gt_label=None, return_loss=True):
        scores = self.head(self.backbone(img))
        if not return_loss:
            return list(scores.detach())
        loss = nn.functional.cross_entropy(scores, gt_label)
        return {'loss_cls': loss, 'loss_aux': [0.1 * scores.pow(2).mean(), 0.0 * loss], 'accuracy': scores.detach()}
