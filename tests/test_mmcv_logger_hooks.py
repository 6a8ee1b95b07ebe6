"""MMCV 1.7's logger hooks call their libraries as MMCV does (issue 39 item 9): what MMCV's
test_hooks.py checks of Pavi (checkpoint uploads), MLflow (log_metrics at each event, the model
with its pip requirements), W&B (define_metric_cfg, the log artifact), DVCLive (its Live object,
the epoch as step), ClearML and Segmind. The libraries are mocks."""
import logging
import os
import sys
from unittest.mock import MagicMock, call

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hookloop.compat.mmcv import (CheckpointHook, ClearMLLoggerHook, DvcliveLoggerHook, MlflowLoggerHook,
                                  PaviLoggerHook, SegmindLoggerHook, WandbLoggerHook, build_runner)

TAGS = {'learning_rate': 0.02, 'momentum': 0.95}  # a train_step without log_vars: the schedule values


class StepModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x):
        return self.linear(x)

    def train_step(self, x, optimizer, **kwargs):
        return dict(loss=self(x).sum())

    def val_step(self, x, optimizer, **kwargs):
        return dict(loss=self(x).sum())


@pytest.fixture
def mocked(monkeypatch):
    def mock(*names):
        modules = [MagicMock() for _ in names]
        for name, module in zip(names, modules):
            monkeypatch.setitem(sys.modules, name, module)
        return modules
    return mock


def run(tmp_path, hook, kind='EpochBasedRunner', validate=True, checkpoint=None, **lengths):
    """MMCV's demo runner: 5 samples of 1, one checkpoint per epoch (per ``checkpoint``)."""
    model = StepModel()
    runner = build_runner(dict(type=kind, **(lengths or dict(max_epochs=1))), default_args=dict(
        model=model, work_dir=str(tmp_path / 'run'), logger=logging.getLogger('t'),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.95)))
    runner.register_checkpoint_hook(checkpoint or dict(interval=1))
    runner.register_hook(hook)
    loader = DataLoader(torch.ones(5, 2))
    try:
        runner.run([loader, loader] if validate else [loader], [('train', 1), ('val', 1)][:2 if validate else 1])
    finally:
        runner.trainer.close()
    return runner


def test_mlflow_logs_each_event_and_the_model_with_its_requirements(tmp_path, mocked):
    mocked('mlflow', 'mlflow.pytorch')
    hook = MlflowLoggerHook(exp_name='test', interval=1)
    runner = run(tmp_path, hook)
    hook.mlflow.set_experiment.assert_called_with('test')
    # one log_metrics per log event, at once: five train iterations, then validation at step 6
    assert hook.mlflow.log_metrics.call_args_list == [call(TAGS, step=n) for n in (1, 2, 3, 4, 5, 6)]
    hook.mlflow_pytorch.log_model.assert_called_with(runner.model, 'models',
                                                     pip_requirements=[f'torch=={torch.__version__}'])
    mocked('mlflow', 'mlflow.pytorch')
    hook = MlflowLoggerHook(log_model=False)
    run(tmp_path / 'b', hook)
    assert not hook.mlflow_pytorch.log_model.called


def test_wandb_defines_metrics_and_uploads_the_logs(tmp_path, mocked):
    mocked('wandb')
    hook = WandbLoggerHook(log_artifact=True, define_metric_cfg={'val/loss': 'min'})
    run(tmp_path, hook)
    hook.wandb.init.assert_called_with()
    hook.wandb.define_metric.assert_called_with('val/loss', summary='min')
    hook.wandb.log.assert_called_with(TAGS, step=6, commit=True)
    artifact = hook.wandb.Artifact.return_value
    added = sorted(os.path.basename(c.args[0]) for c in artifact.add_file.call_args_list)
    assert added and all(name.endswith(('.log', '.log.json')) for name in added)
    hook.wandb.log_artifact.assert_called_with(artifact)
    hook.wandb.join.assert_called_with()
    with pytest.warns(UserWarning, match='summary should be in'):
        run(tmp_path / 'b', WandbLoggerHook(define_metric_cfg={'acc': 'highest'}, log_artifact=False))


@pytest.mark.parametrize('by_epoch', [True, False])
def test_dvclive_steps_and_its_live_object(tmp_path, mocked, by_epoch):
    mocked('dvclive')
    hook = DvcliveLoggerHook(by_epoch=by_epoch)
    run(tmp_path, hook)
    # interval 10 over 5 iterations: the validation alone is logged, at the epoch count with by_epoch
    assert hook.dvclive.set_step.call_args_list == [call(1 if by_epoch else 6)]
    hook.dvclive.log.assert_called_with('momentum', 0.95)
    live = MagicMock()
    assert DvcliveLoggerHook(dvclive=live).dvclive is live and DvcliveLoggerHook().dvclive is not live


def test_clearml_and_segmind(tmp_path, mocked):
    mocked('clearml', 'segmind')
    hook = ClearMLLoggerHook(init_kwargs=dict(project_name='proj', task_name='task'))
    run(tmp_path, hook)
    hook.clearml.Task.init.assert_called_with(project_name='proj', task_name='task')
    hook.task.get_logger.assert_called_with()
    hook.task_logger.report_scalar.assert_has_calls(
        [call('momentum', 'momentum', 0.95, 6), call('learning_rate', 'learning_rate', 0.02, 6)], any_order=True)
    hook = SegmindLoggerHook()
    runner = run(tmp_path / 'b', hook)
    hook.mlflow_log.assert_called_with(hook.log_metrics, TAGS, step=runner.epoch, epoch=runner.epoch)


def test_pavi_uploads_checkpoints_by_epoch_and_by_iteration(tmp_path, mocked):
    mocked('pavi')
    hook = PaviLoggerHook(add_last_ckpt=True, add_ckpt_kwargs=dict(active=True, start=1, interval=2))
    runner = run(tmp_path / 'epochs', hook, max_epochs=6)
    work_dir, tag = runner.work_dir, os.path.basename(runner.work_dir)
    assert hook.writer.add_snapshot_file.call_args_list == [
        call(tag=tag, snapshot_file_path=os.path.join(work_dir, f'epoch_{n}.pth'), iteration=n) for n in (1, 3, 5, 6)]
    hook.writer.add_scalars.assert_called_with('val', TAGS, 6)
    hook.writer.close.assert_called_with()

    mocked('pavi')
    hook = PaviLoggerHook(by_epoch=False, add_last_ckpt=True, add_ckpt_kwargs=dict(active=True, start=0, interval=4))
    runner = run(tmp_path / 'iters', hook, kind='IterBasedRunner', validate=False, max_iters=15,
                 checkpoint=dict(interval=4, by_epoch=False))
    work_dir = runner.work_dir
    assert hook.writer.add_snapshot_file.call_args_list == [
        call(tag=os.path.basename(work_dir), snapshot_file_path=os.path.join(work_dir, f'iter_{n}.pth'), iteration=n)
        for n in (4, 8, 12, 15)]


def test_a_by_epoch_checkpoint_hook_in_an_iteration_runner_saves_nothing(tmp_path):
    """MMCV's IterBasedRunner never calls after_train_epoch: CheckpointHook(by_epoch=True) there
    saves nothing, as in MMCV (it saved a file per pass over the loader here before)."""
    runner = run(tmp_path, CheckpointHook(interval=4, by_epoch=False), kind='IterBasedRunner', validate=False,
                 max_iters=12)
    assert sorted(n for n in os.listdir(runner.work_dir) if n.endswith('.pth')) == \
        ['iter_12.pth', 'iter_4.pth', 'iter_8.pth', 'latest.pth']
