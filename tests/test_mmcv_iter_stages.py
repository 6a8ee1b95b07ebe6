"""MMCV's IterBasedRunner calls ``before_epoch`` once before the loop, ``after_epoch`` once
after it and never the train-epoch stages (issue 39 item 3); hookloop's own hooks keep theirs."""
import logging

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop.compat.build import build_trainer
from hookloop.compat.mmcv import Hook, IterBasedRunner


class StageRecorder(Hook):
    """A hook written for MMCV: it records the stages it is called at."""

    def __init__(self):
        self.calls = []

    def before_run(self, runner):
        self.calls.append('before_run')

    def before_epoch(self, runner):
        self.calls.append('before_epoch')

    def after_epoch(self, runner):
        self.calls.append('after_epoch')

    def after_train_iter(self, runner):
        self.calls.append('iter')

    def after_run(self, runner):
        self.calls.append('after_run')


class TrainEpochOnly(Hook):
    def __init__(self):
        self.calls = 0

    def before_train_epoch(self, runner):
        self.calls += 1


def mmcv_run(tmp_path, runner, *hooks, **extra):
    # 16 samples, 4 per batch: a pass over the loader is 4 iterations
    cfg = dict(model=Regressor(), optimizer=dict(type='SGD', lr=0.01), runner=runner, seed=0, device='cpu',
               data=dict(samples_per_gpu=4, workers_per_gpu=0, train=regression_data(16)),
               work_dir=str(tmp_path / 'run'), custom_hooks=list(hooks), **extra)
    trainer = build_trainer(default_args=cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def test_iter_based_config_calls_the_generic_epoch_stages_once(tmp_path):
    recorder, train_epoch = StageRecorder(), TrainEpochOnly()  # 10 iterations: three passes over the loader
    trainer = mmcv_run(tmp_path, dict(type='IterBasedRunner', max_iters=10), recorder, train_epoch,
                       log_config=dict(interval=2, hooks=[dict(type='TextLoggerHook')]))
    assert recorder.calls == ['before_run', 'before_epoch'] + ['iter'] * 10 + ['after_epoch', 'after_run']
    assert train_epoch.calls == 0  # MMCV's IterBasedRunner never calls the train-epoch stages
    # hookloop's own hooks keep their stages: the text log has every 2nd iteration of the 10
    [log] = [h for h in trainer.hooks if type(h).__name__ == 'TextLoggerHook']
    assert log.by_epoch is False


def test_epoch_based_config_keeps_every_epochs_stages(tmp_path):
    recorder, train_epoch = StageRecorder(), TrainEpochOnly()
    mmcv_run(tmp_path, dict(type='EpochBasedRunner', max_epochs=2), recorder, train_epoch)
    epoch = ['before_epoch'] + ['iter'] * 4 + ['after_epoch']
    assert recorder.calls == ['before_run'] + epoch * 2 + ['after_run'] and train_epoch.calls == 2


def test_iter_based_runner_adapter_and_a_failing_run(tmp_path):
    recorder = StageRecorder()
    model = Regressor()
    runner = IterBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                             work_dir=str(tmp_path / 'adapter'), logger=logging.getLogger('test'), max_iters=6)
    runner.register_hook(recorder)
    try:
        runner.run([DataLoader(regression_data(8), batch_size=4)], [('train', 1)])
    finally:
        runner.trainer.close()
    assert recorder.calls == ['before_run', 'before_epoch'] + ['iter'] * 6 + ['after_epoch', 'after_run']

    class Fails(StageRecorder):
        def after_train_iter(self, runner):
            super().after_train_iter(runner)
            if runner.iter == 1:
                raise RuntimeError('boom')

    failing = Fails()
    with pytest.raises(RuntimeError, match='boom'):
        mmcv_run(tmp_path, dict(type='IterBasedRunner', max_iters=10), failing)
    # MMCV reaches after_epoch only when the loop ends; after_run runs on every exit path here
    assert failing.calls == ['before_run', 'before_epoch', 'iter', 'iter', 'after_run']
