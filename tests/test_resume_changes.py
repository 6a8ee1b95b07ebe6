"""Honest resume: config differences are logged with their rule; a changed lr wins; a
longer run is re-planned; a changed epoch length mid-epoch is refused unless asked for."""
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Hook, Trainer
from hookloop.errors import ConfigError
from hookloop.resume_changes import config_differences


class StopAt(Hook):
    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            trainer.request_stop('test')


def make_trainer(work_dir, lr=0.05, epochs=2, batch_size=8, hooks=(), **kwargs):
    torch.manual_seed(0)
    cfg = dict(optimizer=dict(type='SGD', lr=lr), max_epochs=epochs, train_dataloader=dict(batch_size=batch_size))
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=lr), max_epochs=epochs, work_dir=work_dir, seed=0,
                   train_dataloader=DataLoader(regression_data(), batch_size=batch_size, shuffle=True),
                   device='cpu', log_config=dict(interval=100), custom_hooks=list(hooks),
                   checkpoint_config=dict(interval=1, by_epoch=False), cfg=cfg, **kwargs)


def test_config_differences_are_dotted_and_skip_how_the_run_starts():
    saved = {'optimizer': {'lr': 0.1, 'type': 'SGD'}, 'resume_from': None, 'max_epochs': 2}
    current = {'optimizer': {'lr': 0.01, 'type': 'SGD'}, 'resume_from': 'auto', 'max_epochs': 2, 'seed': 1}
    assert config_differences(saved, current) == [('optimizer.lr', 0.1, 0.01), ('seed', '<absent>', 1)]


def test_changed_lr_on_resume_is_stated_and_the_new_value_wins(tmp_path, capsys):
    train(make_trainer(tmp_path, lr=0.05, hooks=[StopAt(6)]))
    capsys.readouterr()
    resumed = train(make_trainer(tmp_path, lr=0.01, resume_from='auto'))
    out = capsys.readouterr().out
    assert "the config differs from the checkpoint's:\n  optimizer.lr: 0.05 -> 0.01: from iteration 7 each param " \
           'group takes the value a fresh run builds from the new config (the schedule is re-based on it)' in out
    assert '  param group 0: lr 0.05 -> 0.01' in out
    assert resumed.optimizer.param_groups[0]['lr'] == 0.01
    assert resumed.iter == 10


def test_longer_max_epochs_is_replanned_and_stated(tmp_path, capsys):
    train(make_trainer(tmp_path, epochs=1))
    capsys.readouterr()
    resumed = train(make_trainer(tmp_path, epochs=2, resume_from='auto'))
    assert 'max_epochs: 1 -> 2: the schedule is re-planned over the new length' in capsys.readouterr().out
    assert resumed.iter == 10


class ListSampler(torch.utils.data.Sampler):
    """A user's sampler: the loader is not rebuilt (it resumes by fast-forward), so its
    position cannot be re-split over another batch size."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_changed_batch_size_mid_epoch_is_refused_for_a_loader_that_cannot_resplit(tmp_path, capsys):
    def unsplittable(work_dir, batch_size, **kwargs):
        trainer = make_trainer(work_dir, epochs=3, batch_size=batch_size, **kwargs)
        trainer.set_train_dataloader(DataLoader(regression_data(), batch_size=batch_size, sampler=ListSampler(40)),
                                     max_epochs=3)
        return trainer

    train(unsplittable(tmp_path, 8, hooks=[StopAt(6)]))  # stopped at batch 2 of epoch 2
    refused = unsplittable(tmp_path, 4, resume_from='auto')
    with pytest.raises(ConfigError, match=r"mid-epoch \(batch 2 of epoch 2\): batches per epoch changed from 5 "
                                          r"to 10 .*resume_policy='restart_epoch'"):
        refused.train()
    refused.close()
    capsys.readouterr()
    resumed = train(unsplittable(tmp_path, 4, resume_from='auto', resume_policy='restart_epoch'))
    assert 'continuing from the start of epoch 3 (iteration 20)' in capsys.readouterr().out
    assert resumed.iter == 30 and resumed.epoch == 3


def test_unknown_resume_policy_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match='resume_policy must be one of'):
        make_trainer(tmp_path, resume_policy='skip')
