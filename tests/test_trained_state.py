"""CheckpointHook(save_frozen=False): checkpoints of what trains, resumed on top of the
frozen weights the model is built with, which must be the ones the checkpoint was saved on."""
import os

import pytest
import torch
from torch import nn

from conftest import train_and_close as train
from hookloop import CheckpointError, Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.checkpoint.trained_state import frozen_fingerprint, trained_keys


class FrozenBackboneModel(nn.Module):
    """A frozen backbone (a Linear and a BatchNorm) under a trained head with its own BatchNorm."""

    def __init__(self, backbone_seed=0):
        super().__init__()
        torch.manual_seed(backbone_seed)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
        self.backbone.requires_grad_(False)
        torch.manual_seed(100)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.head(self.backbone(x)), y)


class EvalBackboneModel(FrozenBackboneModel):
    """The usual fine-tuning model: its ``train()`` keeps the frozen backbone (its BatchNorm) in eval mode."""

    def train(self, mode=True):
        super().train(mode)
        self.backbone.eval()
        return self


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))


def trainer(work_dir, max_iters=8, backbone_seed=0, model_class=FrozenBackboneModel, **kwargs):
    kwargs.setdefault('checkpoint_config', dict(interval=4, by_epoch=False, save_frozen=False))
    return Trainer(model_class(backbone_seed), optimizer=dict(type='AdamW', lr=1e-2),
                   train_dataloader=dict(dataset=data(), batch_size=8, shuffle=True), max_iters=max_iters,
                   work_dir=str(work_dir), seed=0, device='cpu', log_level='WARNING', **kwargs)


HEAD = {'head.0.weight', 'head.0.bias', 'head.1.weight', 'head.1.bias', 'head.1.running_mean',
        'head.1.running_var', 'head.1.num_batches_tracked', 'head.2.weight', 'head.2.bias'}
FROZEN_BN_STATS = {'backbone.1.running_mean', 'backbone.1.running_var', 'backbone.1.num_batches_tracked'}


def test_trained_keys_are_trainable_parameters_and_buffers_that_training_changes():
    model = FrozenBackboneModel()
    assert trained_keys(model) == HEAD | FROZEN_BN_STATS  # the frozen BatchNorm still updates in train mode
    # What trains is what model.train() leaves in training mode, whatever the current modes are
    # (a checkpoint is saved during validation and checked before the run starts): issue 23 item 7.
    model.eval()
    assert trained_keys(model) == HEAD | FROZEN_BN_STATS and not model.training
    kept = EvalBackboneModel()
    assert trained_keys(kept) == HEAD and kept.backbone.training  # built in train mode, left so
    kept.eval()
    assert trained_keys(kept) == HEAD and not kept.head.training


def test_resume_of_a_model_whose_train_keeps_the_frozen_batchnorm_in_eval(tmp_path):
    """Issue 23 item 7: saved while training (the backbone's BatchNorm in eval, so its statistics
    are frozen and fingerprinted), checked on a freshly built model (all in train mode): the same
    frozen weights, accepted, and the resumed run ends as an uninterrupted one."""
    reference = train(trainer(tmp_path / 'reference', model_class=EvalBackboneModel))
    first = train(trainer(tmp_path / 'run', max_iters=4, model_class=EvalBackboneModel))
    resumed = train(trainer(tmp_path / 'run', model_class=EvalBackboneModel, resume_from=read_pointer(first.work_dir)))
    for key, value in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


def test_checkpoint_omits_frozen_weights_and_resume_is_exact(tmp_path):
    reference = train(trainer(tmp_path / 'reference'))
    first = train(trainer(tmp_path / 'run', max_iters=4))
    checkpoint = load_checkpoint(read_pointer(first.work_dir))
    assert set(checkpoint['state_dict']) == trained_keys(first.model)
    assert checkpoint['meta']['frozen'] == {'saved': False, 'fingerprint': frozen_fingerprint(first.model)}
    resumed = train(trainer(tmp_path / 'run', resume_from=read_pointer(first.work_dir)))
    for key, value in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key
    full = train(trainer(tmp_path / 'full', max_iters=4, checkpoint_config=dict(interval=4, by_epoch=False)))
    assert os.path.getsize(read_pointer(full.work_dir)) > os.path.getsize(read_pointer(first.work_dir))


def test_resume_on_other_frozen_weights_is_refused(tmp_path):
    first = train(trainer(tmp_path / 'run', max_iters=4))
    with pytest.raises(CheckpointError, match='different frozen weights'):
        train(trainer(tmp_path / 'other', backbone_seed=1, resume_from=read_pointer(first.work_dir)))


def test_fingerprint_follows_in_place_changes():
    model = FrozenBackboneModel()
    before = frozen_fingerprint(model)
    assert frozen_fingerprint(model) == before
    with torch.no_grad():
        model.backbone[0].weight[0, 0] += 1
    assert frozen_fingerprint(model) != before
    model.backbone[1].running_mean = torch.ones(8)  # a replaced tensor
    assert frozen_fingerprint(model) != before


def test_load_from_a_trained_only_checkpoint(tmp_path):
    first = train(trainer(tmp_path / 'run', max_iters=4))
    fresh = trainer(tmp_path / 'fresh', max_iters=1, load_from=read_pointer(first.work_dir))
    fresh.load_weights(read_pointer(first.work_dir))
    for key, value in first.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[key], value), key
    fresh.close()
