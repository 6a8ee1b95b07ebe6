"""Hooks OpenMMLab repositories ship, run through an MMCV 1.x config (issue 39 items 1 and 2):
they reach ``runner.model.module`` (mmtracking's ``SiameseRPNOptimizerHook`` unfreezes backbone
layers at an epoch, mmselfsup's ``BYOLHook`` sets the model's momentum at every iteration) and
call MMCV's runner methods (``runner.save_checkpoint(out_dir, filename_tmpl=...)``)."""
import copy
import math
import os
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop.checkpoint.format import load_checkpoint as load_verified
from hookloop.compat.build import build_trainer
from hookloop.compat.mmcv import HOOKS, Hook, OptimizerHook, is_module_wrapper

EPOCHS, UNFREEZE_AT, BATCH = 20, 10, 4


class Tracker(nn.Module):
    """An MMCV-style model (``train_step``) with a frozen backbone stage and a momentum copy."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(OrderedDict(layer1=nn.Linear(4, 8),
                                                  layer2=nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))))
        self.head = nn.Linear(8, 1)
        self.target = copy.deepcopy(self.backbone.layer1).requires_grad_(False)
        self.backbone.layer2.requires_grad_(False)  # trained from UNFREEZE_AT on
        self.base_momentum = self.momentum = 0.9

    def train_step(self, data_batch, optimizer, **kwargs):
        x, y = data_batch
        features = self.backbone.layer2(torch.relu(self.backbone.layer1(x)))
        prediction = self.head(torch.relu(features)) + 0.1 * self.target(x).detach().sum(1, keepdim=True)
        loss = nn.functional.mse_loss(prediction, y)
        return dict(loss=loss, log_vars=dict(loss=loss.item()), num_samples=len(x))

    @torch.no_grad()
    def momentum_update(self):
        for target, online in zip(self.target.parameters(), self.backbone.layer1.parameters()):
            target.mul_(self.momentum).add_(online, alpha=1 - self.momentum)


@HOOKS.register_module(force=True)
class UnfreezeStagesHook(OptimizerHook):
    """SiameseRPNOptimizerHook's shape: an optimizer hook that unfreezes backbone stages."""

    def __init__(self, start_epoch, stages, **kwargs):
        super().__init__(**kwargs)
        self.start_epoch, self.stages = start_epoch, stages

    def before_train_epoch(self, runner):
        if runner.epoch >= self.start_epoch:
            for stage in self.stages:
                for param in getattr(runner.model.module.backbone, stage).parameters():
                    param.requires_grad = True


@HOOKS.register_module(force=True)
class MomentumScheduleHook(Hook):
    """BYOLHook's shape: the model's momentum follows a cosine over the run's iterations."""

    def before_train_iter(self, runner):
        module = runner.model.module
        module.momentum = 1. - (1. - module.base_momentum) * (math.cos(math.pi * runner.iter / runner.max_iters) + 1) / 2

    def after_train_iter(self, runner):
        (runner.model.module if is_module_wrapper(runner.model) else runner.model).momentum_update()


def data():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True))


OPTIMIZER = dict(type='SGD', lr=0.05, momentum=0.9, weight_decay=1e-4)


def mmcv_config(tmp_path, model, **extra):
    cfg = dict(model=model, runner=dict(type='EpochBasedRunner', max_epochs=EPOCHS), seed=0, device='cpu',
               data=dict(samples_per_gpu=BATCH, workers_per_gpu=0, shuffle=False, train=data()),
               optimizer=OPTIMIZER, work_dir=str(tmp_path / 'run'),
               optimizer_config=dict(type='UnfreezeStagesHook', start_epoch=UNFREEZE_AT, stages=['layer2']),
               custom_hooks=[dict(type='MomentumScheduleHook')], log_config=dict(interval=100, hooks=[]))
    cfg.update(extra)
    return cfg


def plain_mmcv_loop(model):
    """What MMCV's EpochBasedRunner does with these two hooks: the model wrapped, the optimizer
    over all the parameters (frozen ones too), the hooks at their stages and priorities."""

    class Runner:  # the attributes the hooks read
        pass

    runner = Runner()
    runner.model = nn.DataParallel(model)  # what MMCV's MMDataParallel is on a machine without GPUs
    runner.max_iters, runner.iter = EPOCHS * len(data()) // BATCH, 0
    optimizer = torch.optim.SGD(model.parameters(), **{k: v for k, v in OPTIMIZER.items() if k != 'type'})
    unfreeze = UnfreezeStagesHook.__new__(UnfreezeStagesHook)
    unfreeze.start_epoch, unfreeze.stages = UNFREEZE_AT, ['layer2']
    schedule = MomentumScheduleHook()
    for runner.epoch in range(EPOCHS):
        model.train()
        unfreeze.before_train_epoch(runner)
        for batch in DataLoader(data(), batch_size=BATCH, shuffle=False):
            schedule.before_train_iter(runner)
            outputs = model.train_step(batch, optimizer)
            optimizer.zero_grad()  # MMCV's OptimizerHook.after_train_iter (ABOVE_NORMAL: before NORMAL)
            outputs['loss'].backward()
            optimizer.step()
            schedule.after_train_iter(runner)
            runner.iter += 1
    return model


def test_repo_hooks_reaching_runner_model_module_train_like_mmcv(tmp_path):
    model = Tracker()
    expected = plain_mmcv_loop(copy.deepcopy(model))
    trainer = build_trainer(default_args=mmcv_config(tmp_path, model))
    try:
        trainer.train()
    finally:
        trainer.close()
    assert trainer.iter == EPOCHS * 4 and trainer.model.module is model and is_module_wrapper(trainer.model)
    trained = model.state_dict()
    # layer2 trained after the unfreeze: the optimizer held it from the start, as MMCV builds it
    assert not torch.equal(trained['backbone.layer2.0.weight'], Tracker().state_dict()['backbone.layer2.0.weight'])
    assert all(torch.equal(trained[key], value) for key, value in expected.state_dict().items())
    assert model.momentum == expected.momentum
    # the checkpoint holds the model's own names (MMCV saves the model inside its wrapper)
    trainer = build_trainer(default_args=mmcv_config(tmp_path, Tracker(), checkpoint_config=dict(interval=EPOCHS),
                                                     runner=dict(type='EpochBasedRunner', max_epochs=1)))
    try:
        trainer.train()
    finally:
        trainer.close()
    saved = load_verified(os.path.join(trainer.work_dir, 'epoch_1.pth'))['state_dict']
    assert set(saved) == set(Tracker().state_dict())


@HOOKS.register_module(force=True)
class SnapshotHook(Hook):
    """A repository hook that saves with MMCV's runner API."""

    def __init__(self, out_dir=None):
        self.out_dir = out_dir

    def after_train_epoch(self, runner):
        if runner.epoch % 2 == 1:
            runner.save_checkpoint(self.out_dir or runner.work_dir, filename_tmpl='snapshot_{}.pth',
                                   save_optimizer=False, meta=dict(note=f'epoch {runner.epoch + 1}'),
                                   create_symlink=False)

    def after_train_iter(self, runner):
        if runner.iter == 2:  # the defaults: epoch_<n>.pth and latest.pth
            self.default_path = runner.save_checkpoint(runner.work_dir)

    def after_run(self, runner):
        self.lrs, self.momenta = runner.current_lr(), runner.current_momentum()
        self.loaded = runner.load_checkpoint(os.path.join(runner.work_dir, 'snapshot_2.pth'))


def test_repo_hook_calls_mmcv_save_checkpoint(tmp_path):
    hook = SnapshotHook()
    other = SnapshotHook(out_dir=str(tmp_path / 'elsewhere'))
    cfg = mmcv_config(tmp_path, Tracker(), runner=dict(type='EpochBasedRunner', max_epochs=4),
                      custom_hooks=[hook, other])
    trainer = build_trainer(default_args=cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    work_dir = trainer.work_dir
    for directory in (work_dir, str(tmp_path / 'elsewhere')):
        for n in (2, 4):
            checkpoint = load_verified(os.path.join(directory, f'snapshot_{n}.pth'))
            assert checkpoint['meta']['note'] == f'epoch {n}' and 'optimizer' not in checkpoint
            assert set(checkpoint['state_dict']) == set(Tracker().state_dict())
    # create_symlink=False: no latest.pth from these; the defaults of MMCV's signature made one
    assert hook.default_path == os.path.join(work_dir, 'epoch_1.pth')
    assert os.path.realpath(os.path.join(work_dir, 'latest.pth')) == os.path.realpath(hook.default_path)
    assert 'optimizer' in load_verified(hook.default_path)
    assert not os.path.lexists(tmp_path / 'elsewhere' / 'latest.pth')
    assert hook.lrs == [0.05] and hook.momenta == [0.9] and 'state_dict' in hook.loaded
    # a save outside the work dir does not move its last_checkpoint pointer
    with open(os.path.join(work_dir, 'last_checkpoint')) as pointer:
        assert 'elsewhere' not in pointer.read()


def test_runner_api_keeps_the_trainers_own_forms(tmp_path):
    """hookloop's own hooks call ``save_checkpoint(file_path, update_last=...)``; an MMCV call
    with a bad ``meta`` is MMCV's TypeError; ``call_hook`` takes any method name (MMCV)."""
    trainer = build_trainer(default_args=mmcv_config(tmp_path, Tracker(), runner=dict(type='EpochBasedRunner',
                                                                                          max_epochs=1)))
    calls = []

    class Custom(Hook):
        def before_epoch(self, runner):
            calls.append('before_epoch')

        def my_event(self, runner):
            calls.append('my_event')

    trainer.register_hook(Custom())
    try:
        trainer.train()
        path = trainer.save_checkpoint('manual.pth', update_last=False)
        assert path.endswith('manual.pth') and os.path.exists(path)
        with pytest.raises(TypeError):
            trainer.save_checkpoint(trainer.work_dir, meta=['not a dict'])
        calls.clear()
        trainer.call_hook('my_event')
        assert calls == ['my_event']
    finally:
        trainer.close()


def test_optimizer_hook_driven_by_code_outside_a_trainer():
    """A repository's own loop (or a mock runner) calls OptimizerHook.after_train_iter itself:
    MMCV's step, with the parameters outside the loss's graph logged at ERROR (MMCV's report)."""
    from unittest.mock import MagicMock

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(2, 2), nn.Linear(2, 2)

    model = Two()
    runner = MagicMock()
    runner.model, runner.optimizer = model, torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.used.weight.detach().clone()
    runner.outputs = dict(loss=model.used(torch.ones(1, 2)).sum(), num_samples=1)
    OptimizerHook(dict(max_norm=2), detect_anomalous_params=True).after_train_iter(runner)
    logged = [c.kwargs['msg'] for c in runner.logger.log.call_args_list]
    assert [m.split(' ')[0] for m in logged] == ['unused.weight', 'unused.bias']
    assert all(c.kwargs['level'] == 40 and 'is not in the computational graph' in c.kwargs['msg']
               for c in runner.logger.log.call_args_list)
    assert not torch.equal(model.used.weight, before)  # stepped
    assert runner.log_buffer.update.call_args.args[0].keys() == {'grad_norm'}
