"""Honest resume: config differences are logged with their rule; a changed lr wins; a
longer run is re-planned; a changed epoch length mid-epoch is refused unless asked for."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from resume_helpers import StopAt
from hookloop import Hook, Trainer
from hookloop.errors import ConfigError
from hookloop.checkpoint.resume_changes import config_differences


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


# -- issue 23: what the log says happens -------------------------------------------------------
class Net(nn.Module):
    """A backbone, a LayerNorm and a head: named groups for paramwise_cfg."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 1)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.head(self.norm(self.backbone(x))), y)


def paramwise_trainer(work_dir, optimizer, hooks=(), **kwargs):
    cfg = dict(optimizer=optimizer, max_epochs=2)
    return Trainer(Net(), optimizer=optimizer, max_epochs=2, work_dir=work_dir, seed=0,
                   train_dataloader=DataLoader(regression_data(), batch_size=8, shuffle=True), device='cpu',
                   log_config=dict(interval=100), custom_hooks=list(hooks),
                   checkpoint_config=dict(interval=1, by_epoch=False), cfg=cfg, **kwargs)


def sgd(lr=0.02, weight_decay=1e-4, backbone_lr_mult=0.1):
    return dict(type='SGD', lr=lr, weight_decay=weight_decay,
                paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=backbone_lr_mult)}, bias_lr_mult=2,
                                   norm_decay_mult=0))


def group_values(trainer, name):
    return [round(group[name], 12) for group in trainer.optimizer.param_groups]


def fresh_groups(optimizer, name):
    return group_values(paramwise_trainer('unused', optimizer), name)


def test_new_lr_with_paramwise_cfg_keeps_the_multipliers(tmp_path, capsys):
    """Item 2: before, every group got the new lr: [0.1] * 6."""
    train(paramwise_trainer(tmp_path, sgd(lr=0.05), hooks=[StopAt(6)]))
    capsys.readouterr()
    resumed = train(paramwise_trainer(tmp_path, sgd(lr=0.1), resume_from='auto'))
    # backbone weight, bias (lr_mult 0.1), norm weight, bias (a norm's bias: no bias_lr_mult), head weight, bias (x2)
    assert group_values(resumed, 'lr') == [0.01, 0.01, 0.1, 0.1, 0.1, 0.2] == fresh_groups(sgd(lr=0.1), 'lr')
    out = capsys.readouterr().out
    assert '  param group 0: lr 0.005 -> 0.01\n' in out and '  param group 5: lr 0.1 -> 0.2' in out


def test_new_weight_decay_keeps_the_decay_rules(tmp_path, capsys):
    """Item 2 (the same code path): before, the norm groups (norm_decay_mult=0) got decay."""
    train(paramwise_trainer(tmp_path, sgd(weight_decay=1e-4), hooks=[StopAt(6)]))
    capsys.readouterr()
    resumed = train(paramwise_trainer(tmp_path, sgd(weight_decay=1e-3), resume_from='auto'))
    assert group_values(resumed, 'weight_decay') == [1e-3, 1e-3, 0, 0, 1e-3, 1e-3]
    assert group_values(resumed, 'lr') == [0.002, 0.002, 0.02, 0.02, 0.02, 0.04]  # untouched
    out = capsys.readouterr().out
    assert 'param group 0: weight_decay 0.0001 -> 0.001' in out and 'param group 2:' not in out


def test_changed_lr_mult_alone_is_applied(tmp_path, capsys):
    """Item 3: before, 'the new value is used' was logged and the backbone kept 0.001."""
    train(paramwise_trainer(tmp_path, sgd(backbone_lr_mult=0.05), hooks=[StopAt(6)]))
    capsys.readouterr()
    resumed = train(paramwise_trainer(tmp_path, sgd(backbone_lr_mult=0.25), resume_from='auto'))
    assert group_values(resumed, 'lr')[:2] == [0.005, 0.005]
    out = capsys.readouterr().out
    assert "optimizer.paramwise_cfg.custom_keys.backbone.lr_mult: 0.05 -> 0.25: from iteration 7 each param group " \
           'takes the value a fresh run builds from the new config' in out
    assert 'param group 0: lr 0.001 -> 0.005' in out and 'param group 2:' not in out


class Scripted:
    """An evaluator returning the next of ``results`` at each validation."""

    def __init__(self, results):
        self.results = list(results)

    def reset(self):
        pass

    def update(self, outputs, batch):
        pass

    def compute(self):
        return self.results.pop(0)


def best_trainer(work_dir, save_best, results, epochs, **kwargs):
    evaluation = dict(interval=1, save_best=save_best)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.01), max_epochs=epochs, work_dir=work_dir, seed=0,
                   train_dataloader=DataLoader(regression_data(), batch_size=8),
                   val_dataloader=DataLoader(regression_data(8), batch_size=8), val_evaluator=Scripted(results),
                   evaluation=evaluation, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=dict(interval=1), cfg=dict(evaluation=evaluation, max_epochs=epochs), **kwargs)


def test_changed_save_best_metric_starts_a_new_record_and_the_old_file_stays(tmp_path, capsys):
    """Item 4: before, mAP 0.40 and 0.50 were compared with the old acc 0.95 (never saved),
    and best_acc was deleted later."""
    train(best_trainer(tmp_path, 'acc', [dict(acc=0.95, mAP=0.3), dict(acc=0.9, mAP=0.35)], epochs=2))
    assert sorted(p.name for p in tmp_path.glob('best_*.pth')) == ['best_acc_epoch_1.pth']
    capsys.readouterr()
    resumed = train(best_trainer(tmp_path, 'mAP', [dict(acc=0.5, mAP=0.40), dict(acc=0.99, mAP=0.50)], epochs=4,
                                 resume_from='auto'))
    assert 'evaluation.save_best: \'acc\' -> \'mAP\': a new best record starts under the new metric; the old best ' \
           'checkpoint file stays' in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob('best_*.pth')) == ['best_acc_epoch_1.pth', 'best_mAP_epoch_4.pth']
    best = next(h for h in resumed.hooks if type(h).__name__ == 'EvaluationHook').best
    assert best.metric == 'mAP' and best.score == 0.5


def test_ema_resume_from_with_highest_priority_and_a_torch_scheduler_from_a_dict(tmp_path):
    """Item 5: EMAHook(resume_from=..., priority='HIGHEST') resumed from inside its before_run,
    before the TorchSchedulerHook had built its scheduler: AttributeError. Now the trainer
    resumes before before_run: the run ends exactly as an uninterrupted one (weights, EMA, lr)."""
    def run(work_dir, hooks=(), ema_resume=None):
        ema = dict(type='EMAHook', momentum=0.2, warm_up=0, priority='HIGHEST', resume_from=ema_resume)
        return train(make_trainer(work_dir, epochs=2, hooks=[*hooks, ema],
                                  lr_config=dict(type='TorchSchedulerHook', by_epoch=False,
                                                 scheduler=dict(type='CosineAnnealingLR', T_max=10))))

    reference = run(tmp_path / 'reference')
    run(tmp_path / 'run', hooks=[StopAt(6)])
    resumed = run(tmp_path / 'resumed', ema_resume=str(tmp_path / 'run' / 'iter_7.pth'))
    assert resumed.iter == 10 and resumed.resumed_from.endswith('iter_7.pth')
    for key, value in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key
    ema = [next(h for h in t.hooks if type(h).__name__ == 'EMAHook').averages for t in (reference, resumed)]
    for key in ema[0]:
        assert torch.equal(ema[0][key], ema[1][key]), key
    assert resumed.optimizer.param_groups[0]['lr'] == reference.optimizer.param_groups[0]['lr']


def test_resumed_run_logs_and_keeps_the_checkpoints_seed(tmp_path, capsys):
    """Item 6 (and issue 20 item 9): a drawn seed was printed but not used; a given one was
    logged as 'the new value is used' and not used either. The log says the checkpoint's seed is
    kept, and it is: the run ends as the uninterrupted seed-0 run."""
    reference = train(make_trainer(tmp_path / 'reference'))
    train(make_trainer(tmp_path / 'run', hooks=[StopAt(6)]))
    capsys.readouterr()
    drawn = make_trainer(tmp_path / 'run', resume_from='auto')
    drawn.seed, drawn._seed_given = 12345, False  # as if seed=None had drawn it
    train(drawn)
    out = capsys.readouterr().out
    assert 'hookloop run: seed 0,' in out and '12345' not in out and drawn.seed == 0
    given = make_trainer(tmp_path / 'given', hooks=[StopAt(6)])
    train(given)
    capsys.readouterr()
    resumed = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), max_epochs=2, work_dir=tmp_path / 'given',
                      seed=5, train_dataloader=DataLoader(regression_data(), batch_size=8, shuffle=True),
                      device='cpu', log_config=dict(interval=100), resume_from='auto',
                      cfg=dict(optimizer=dict(type='SGD', lr=0.05), max_epochs=2, seed=5,
                               train_dataloader=dict(batch_size=8)))
    train(resumed)
    out = capsys.readouterr().out
    assert "seed: '<absent>' -> 5: the checkpoint's seed (0) is kept" in out
    assert "seed=5 is given but the checkpoint was trained with seed 0: the checkpoint's seed is kept" in out
    assert 'hookloop run: seed 0,' in out and resumed.seed == 0
    for key, value in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


def test_stateful_dataloader_with_another_batch_size_restarts_the_epoch_without_its_old_state(tmp_path, capsys):
    """A StatefulDataLoader's state cannot be re-split: refused mid-epoch; with
    resume_policy='restart_epoch' the next epoch starts whole (the saved state, a position in
    the old batches, is not loaded into it)."""
    stateful = pytest.importorskip('torchdata.stateful_dataloader')

    def run(work_dir, batch_size, **kwargs):
        trainer = make_trainer(work_dir, epochs=3, batch_size=batch_size, **kwargs)
        trainer.set_train_dataloader(stateful.StatefulDataLoader(regression_data(), batch_size=batch_size,
                                                                 shuffle=True), max_epochs=3)
        return trainer

    train(run(tmp_path, 8, hooks=[StopAt(6)]))
    refused = run(tmp_path, 4, resume_from='auto')
    with pytest.raises(ConfigError, match='batches per epoch changed from 5 to 10'):
        refused.train()
    refused.close()
    capsys.readouterr()
    resumed = train(run(tmp_path, 4, resume_from='auto', resume_policy='restart_epoch'))
    assert 'continuing from the start of epoch 3 (iteration 20)' in capsys.readouterr().out
    assert resumed.iter == 30 and resumed.epoch == 3


# -- issue 38 item 5: the report for Python-API resumes, an API-shaped preemption hint -------------------
def api_trainer(work_dir, batch_size=4, max_epochs=4, lr=0.05, hooks=(), **kwargs):
    """A trainer built in Python: no cfg."""
    torch.manual_seed(0)
    from conftest import Regressor, regression_data
    loader = torch.utils.data.DataLoader(regression_data(), batch_size=batch_size, shuffle=True)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=lr, momentum=0.9), train_dataloader=loader,
                   max_epochs=max_epochs, work_dir=str(work_dir), seed=0, device='cpu',
                   checkpoint_config=dict(interval=1), custom_hooks=list(hooks), **kwargs)


def test_a_python_api_resume_reports_what_changed_and_what_was_kept(tmp_path, capsys):
    """Before: max_epochs 4 -> 6 and batch 4 -> 8 from Python logged nothing (the report needed a cfg)."""
    from conftest import train_and_close
    train_and_close(api_trainer(tmp_path, max_epochs=4))
    capsys.readouterr()
    resumed = train_and_close(api_trainer(tmp_path, batch_size=8, max_epochs=6, resume_from='auto'))
    out = capsys.readouterr().out
    assert 'max_epochs: 4 -> 6: the schedule is re-planned over the new length' in out
    assert 'batch_size: 4 -> 8: the epoch continues from where' in out
    assert "kept: world_size 1, seed 0, optimizer SGD(lr=0.05, momentum=0.9" in out
    assert resumed.epoch == 6


def test_every_resume_reports_even_when_nothing_changed(tmp_path, capsys):
    from conftest import train_and_close
    from resume_helpers import StopAt
    train_and_close(api_trainer(tmp_path, hooks=[StopAt(12)]))
    capsys.readouterr()
    train_and_close(api_trainer(tmp_path, hooks=[StopAt(100)], resume_from='auto'))  # the same hooks
    out = capsys.readouterr().out
    assert "the settings are the checkpoint's (max_epochs 4, batch_size 4, world_size 1, seed 0, optimizer SGD(lr=0.05, " \
           'momentum=0.9, dampening=0, weight_decay=0, nesterov=False))' in out


def test_a_python_api_lr_change_is_applied_as_the_report_says(tmp_path, capsys):
    from conftest import train_and_close
    from resume_helpers import StopAt
    train_and_close(api_trainer(tmp_path, hooks=[StopAt(12)]))
    capsys.readouterr()
    seen = []

    class Lr(Hook):
        def before_train_iter(self, trainer):
            seen.append(trainer.optimizer.param_groups[0]['lr'])

    train_and_close(api_trainer(tmp_path, lr=0.01, hooks=[StopAt(100), Lr()], resume_from='auto'))
    assert 'optimizer.lr: 0.05 -> 0.01: from iteration 10 each param group takes' in capsys.readouterr().out
    assert set(seen) == {0.01}


def test_the_preemption_hint_is_shaped_for_python_users(tmp_path, capsys):
    """Before: 'continue with --resume auto' in a Python script too."""
    import os
    import signal
    from conftest import train_and_close

    class SigtermAt(Hook):
        def before_train_iter(self, trainer):
            if trainer.iter == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = train_and_close(api_trainer(tmp_path, hooks=[SigtermAt()]))
    assert trainer.outcome.stopped
    out = capsys.readouterr().out
    assert "continue with trainer.train() again, or Trainer(..., resume_from='auto') with work_dir=" in out
    assert '--resume auto' not in out


def test_the_cli_hint_is_the_command_that_resumes(tmp_path):
    from hookloop.cli import _resume_command
    import argparse
    args = argparse.Namespace(config='configs/x.py', cfg_options=['optimizer.lr=0.1'])
    assert _resume_command(args, tmp_path / 'w d') == \
        f"hookloop train configs/x.py --work-dir '{tmp_path / 'w d'}' --resume auto --cfg-options optimizer.lr=0.1"
