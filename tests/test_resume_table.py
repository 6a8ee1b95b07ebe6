"""The rows of docs/checkpoints.md's "resume with a changed config" table not covered elsewhere:
each change is logged with its rule, and the rule is what happens (issue 23)."""
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import regression_data
from conftest import train_and_close as train
from resume_helpers import StopAt
from hookloop import Hook, Trainer


class DropoutNet(nn.Module):
    """Dropout draws from the global RNG: a resume must continue it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.autocast = []

    def forward(self, x, y):
        self.autocast.append(torch.is_autocast_enabled('cpu') and torch.get_autocast_dtype('cpu'))
        return nn.functional.mse_loss(self.net(x), y)


class Lrs(Hook):
    PRIORITY = 'LOWEST'

    def __init__(self):
        self.seen = []

    def before_train_iter(self, trainer):
        self.seen.append((trainer.iter, trainer.optimizer.param_groups[0]['lr']))


def make(work_dir, hooks=(), num_workers=0, length=None, lr_config=None, optimizer_config=None, ema=None,
         checkpoint_config=None, **kwargs):
    length = length or dict(max_epochs=2)
    cfg = dict(length, lr_config=lr_config, optimizer_config=optimizer_config, num_workers=num_workers,
               custom_hooks=[ema] if ema else [])
    return Trainer(DropoutNet(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), work_dir=work_dir, seed=0,
                   train_dataloader=DataLoader(regression_data(), batch_size=8, shuffle=True,
                                               num_workers=num_workers),
                   device='cpu', log_config=dict(interval=100), lr_config=lr_config, optimizer_config=optimizer_config,
                   custom_hooks=[*([ema] if ema else []), *hooks], cfg=cfg,
                   checkpoint_config=checkpoint_config or dict(interval=1, by_epoch=False), **length, **kwargs)


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize('stop', [4, 6], ids=['epoch_end', 'mid_epoch'])
def test_num_workers_changed_the_data_and_the_result_do_not_change(tmp_path, capsys, stop):
    reference = weights(train(make(tmp_path / 'reference')))
    train(make(tmp_path / 'run', hooks=[StopAt(stop)]))
    capsys.readouterr()
    resumed = train(make(tmp_path / 'run', num_workers=1, resume_from='auto'))
    assert 'num_workers: 0 -> 1: the new value is used' in capsys.readouterr().out
    for key, value in reference.items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


def cosine(t, total, base=0.05):
    return 0.5 * base * (1 + math.cos(math.pi * t / total))


def test_longer_max_iters_replans_the_schedule(tmp_path, capsys):
    cos = dict(policy='CosineAnnealing', min_lr=0, by_epoch=False)
    train(make(tmp_path, length=dict(max_iters=8), lr_config=cos, hooks=[StopAt(5)]))
    capsys.readouterr()
    lrs = Lrs()
    resumed = train(make(tmp_path, length=dict(max_iters=12), lr_config=cos, hooks=[lrs], resume_from='auto'))
    assert 'max_iters: 8 -> 12: the schedule is re-planned over the new length' in capsys.readouterr().out
    assert [it for it, _ in lrs.seen] == list(range(6, 12)) and resumed.iter == 12
    for it, lr in lrs.seen:
        assert math.isclose(lr, cosine(it, 12), rel_tol=1e-9), it


def test_changed_schedule_policy_applies_from_the_resumed_iteration(tmp_path, capsys):
    train(make(tmp_path, lr_config=dict(policy='Step', step=[100], by_epoch=False), hooks=[StopAt(6)]))
    capsys.readouterr()
    lrs = Lrs()
    train(make(tmp_path, lr_config=dict(policy='CosineAnnealing', min_lr=0, by_epoch=False), hooks=[lrs],
               resume_from='auto'))
    assert 'lr_config.policy: \'Step\' -> \'CosineAnnealing\': the new schedule applies from iteration 7' in \
        capsys.readouterr().out
    assert [it for it, _ in lrs.seen] == [7, 8, 9]
    for it, lr in lrs.seen:
        assert math.isclose(lr, cosine(it, 10), rel_tol=1e-9), it


class EmaStep(Hook):
    """The averages and parameters around the first resumed update (runs after EMAHook)."""

    PRIORITY = 'LOWEST'

    def __init__(self):
        self.before = self.after = self.params = None

    def before_train_iter(self, trainer):
        if self.before is None:
            self.before = {k: v.clone() for k, v in self._ema(trainer).averages.items()}

    def after_train_iter(self, trainer):
        if self.after is None:
            self.after = {k: v.clone() for k, v in self._ema(trainer).averages.items()}
            self.params = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}

    @staticmethod
    def _ema(trainer):
        return next(h for h in trainer.hooks if type(h).__name__ == 'EMAHook')


@pytest.mark.parametrize('stop', [4, 6], ids=['epoch_end', 'mid_epoch'])
def test_changed_ema_momentum_is_used_on_the_restored_averages(tmp_path, capsys, stop):
    train(make(tmp_path, ema=dict(type='EMAHook', momentum=0.1, warm_up=0), hooks=[StopAt(stop)]))
    saved = torch.load(tmp_path / f'iter_{stop + 1}.pth', weights_only=True)['hooks']['EMAHook']['averages']
    capsys.readouterr()
    probe = EmaStep()
    train(make(tmp_path, ema=dict(type='EMAHook', momentum=0.5, warm_up=0), hooks=[probe], resume_from='auto'))
    out = capsys.readouterr().out
    assert "custom_hooks: [{'type': 'EMAHook', 'momentum': 0.1, 'warm_up': 0}] -> [{'type': 'EMAHook', " \
           "'momentum': 0.5, 'warm_up': 0}]: the new value is used" in out
    for name, average in probe.before.items():
        assert torch.equal(average, saved[name]), name  # restored
        expected = 0.5 * saved[name] + 0.5 * probe.params[name]
        assert torch.allclose(probe.after[name], expected, atol=1e-7), name  # updated with the new momentum


@pytest.mark.parametrize('stop', [4, 6], ids=['epoch_end', 'mid_epoch'])
def test_changed_precision_is_used_from_the_resumed_iteration(tmp_path, capsys, stop):
    train(make(tmp_path, optimizer_config=dict(precision='fp16'), hooks=[StopAt(stop)]))
    capsys.readouterr()
    resumed = train(make(tmp_path, optimizer_config=dict(precision='bf16'), resume_from='auto'))
    assert "optimizer_config.precision: 'fp16' -> 'bf16': the new value is used" in capsys.readouterr().out
    assert resumed.model.autocast and set(resumed.model.autocast) == {torch.bfloat16}


class CountSteps(Hook):
    def setup(self, trainer):
        self.steps, step = [], trainer.optimizer.step

        def counted(*args, **kwargs):
            self.steps.append(trainer.iter)
            return step(*args, **kwargs)
        trainer.optimizer.step = counted


def test_changed_accumulation_at_an_epoch_boundary_uses_the_new_windows(tmp_path, capsys):
    train(make(tmp_path, optimizer_config=dict(cumulative_iters=1), checkpoint_config=dict(interval=1),
               hooks=[StopAt(4)]))
    capsys.readouterr()
    counter = CountSteps()
    train(make(tmp_path, optimizer_config=dict(cumulative_iters=2), checkpoint_config=dict(interval=1),
               hooks=[counter], resume_from=str(tmp_path / 'epoch_1.pth')))
    assert 'optimizer_config.cumulative_iters: 1 -> 2: the new value is used' in capsys.readouterr().out
    assert counter.steps == [6, 8, 9]  # windows of 2 from the epoch's start; the last one shorter
