"""Schedules resume exactly; training with a schedule equals a plain PyTorch loop; a torch
LRScheduler can drive the learning rate, per iteration or per epoch, and resumes too."""
import math

import pytest
import torch

from hookloop import ConfigError
from conftest import regression_data
from schedule_recording import LRS, Recorder, make_trainer, record, two_group_optimizer


def plain_loop(lr_at, epochs=6, batch_size=8, optimizer='SGD', scheduler=None, per_iter=True):
    """The reference: a hand-written loop setting ``lr_at(i, group)`` before each step, or
    stepping a torch ``scheduler(optimizer)`` after each iteration / epoch."""
    from conftest import Regressor
    torch.manual_seed(0)
    model = Regressor()
    opt = two_group_optimizer(model, optimizer)
    sched = scheduler(opt) if scheduler is not None else None
    i = 0
    for _ in range(epochs):
        for x, y in torch.utils.data.DataLoader(regression_data(), batch_size=batch_size):
            if lr_at is not None:
                for g, group in enumerate(opt.param_groups):
                    group['lr'] = lr_at(i, g)
            model(x, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if sched is not None and per_iter:
                sched.step()
            i += 1
        if sched is not None and not per_iter:
            sched.step()
    return model


def assert_same_weights(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def train(tmp_path, **kwargs):
    trainer = make_trainer(tmp_path, **kwargs)
    trainer.train()
    trainer.close()
    return trainer


def test_step_schedule_with_warmup_trains_the_same_weights_as_a_plain_loop(tmp_path):
    trainer = train(tmp_path, lr_config=dict(policy='Step', step=[3, 5], warmup='linear', warmup_iters=7,
                                             warmup_ratio=0.25))

    def lr_at(i, g):
        lr = LRS[g] * 0.1 ** ((i // 5 >= 3) + (i // 5 >= 5))
        return lr * (1 - (1 - i / 7) * 0.75) if i < 7 else lr
    assert_same_weights(trainer.model, plain_loop(lr_at))


def test_cosine_by_iter_trains_the_same_weights_as_a_plain_loop(tmp_path):
    trainer = train(tmp_path, lr_config=dict(policy='CosineAnnealing', min_lr=0.0, by_epoch=False))
    assert_same_weights(trainer.model, plain_loop(lambda i, g: 0.5 * LRS[g] * (1 + math.cos(math.pi * i / 30))))


STEP_WITH_WARMUP = dict(policy='Step', step=[3, 5], warmup='exp', warmup_iters=7)
TORCH_PER_EPOCH = dict(type='TorchSchedulerHook', scheduler=dict(type='StepLR', step_size=2, gamma=0.5))


@pytest.mark.parametrize('lr_config,momentum_config,stop_at', [
    (STEP_WITH_WARMUP, None, 13),  # mid-epoch: the epoch's regular value is set again on resume
    (STEP_WITH_WARMUP, None, 15),  # at an epoch end, on a step milestone
    (STEP_WITH_WARMUP, None, 6),  # inside the warm-up
    (dict(policy='CosineAnnealing', min_lr_ratio=0.01, by_epoch=False, warmup='linear', warmup_iters=12),
     dict(policy='CosineAnnealing', min_momentum_ratio=0.8, by_epoch=False, warmup='linear', warmup_iters=12,
          warmup_ratio=0.95), 9),
    (dict(policy='OneCycle', max_lr=0.05), dict(policy='OneCycle', max_momentum=0.93), 13),
    (dict(policy='Cyclic', cyclic_times=2), dict(policy='Cyclic', cyclic_times=2), 13),
    (TORCH_PER_EPOCH, None, 13),
    (TORCH_PER_EPOCH, None, 10),
    (dict(type='TorchScheduler', scheduler=dict(type='CosineAnnealingLR', T_max=30), by_epoch=False), None, 13),
])
def test_resumed_run_applies_the_same_values_and_weights(tmp_path, lr_config, momentum_config, stop_at):
    hooks = dict(lr_config=lr_config, momentum_config=momentum_config)
    full = make_trainer(tmp_path / 'full', **hooks)
    full_record = full.register_hook(Recorder())
    full.train()
    full.close()

    class StopAt(Recorder):
        def after_train_iter(self, trainer):
            if trainer.iter + 1 == stop_at:
                trainer.save_checkpoint('stop.pth')
                trainer.request_stop('test')

    first = make_trainer(tmp_path / 'run', **hooks)
    first.register_hook(StopAt())
    first.train()
    first.close()
    second = make_trainer(tmp_path / 'run', resume_from=str(tmp_path / 'run' / 'stop.pth'), **hooks)
    resumed = second.register_hook(Recorder())
    second.train()
    second.close()
    assert resumed.lrs == full_record.lrs[stop_at:]
    assert resumed.momenta == full_record.momenta[stop_at:]
    assert_same_weights(second.model, full.model)


def test_torch_scheduler_per_iteration_equals_a_plain_loop(tmp_path):
    def build(optimizer):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.05, 0.01], total_steps=30)
    recorder = record(tmp_path, lr_config=dict(type='TorchSchedulerHook', scheduler=build, by_epoch=False))
    reference = plain_loop(None, scheduler=build, per_iter=True)
    # the learning rates the plain loop used, replayed on a fresh optimizer
    opt = two_group_optimizer(type(reference)(), 'SGD')
    sched = build(opt)
    expected = []
    for _ in range(30):
        expected.append([g['lr'] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert recorder.lrs == expected
    trainer = train(tmp_path / 'w', lr_config=dict(type='TorchSchedulerHook', scheduler=build, by_epoch=False))
    assert_same_weights(trainer.model, reference)


def test_torch_scheduler_per_epoch_equals_a_plain_loop(tmp_path):
    cfg = dict(type='TorchSchedulerHook', scheduler=dict(type='MultiStepLR', milestones=[2, 4], gamma=0.1))
    trainer = train(tmp_path, lr_config=cfg)
    reference = plain_loop(None, scheduler=lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 4], 0.1),
                           per_iter=False)
    assert_same_weights(trainer.model, reference)
    recorder = record(tmp_path / 'r', lr_config=cfg)
    assert [row[0] for row in recorder.lrs[::5]] == pytest.approx([0.01, 0.01, 1e-3, 1e-3, 1e-4, 1e-4], rel=1e-12)


def test_torch_scheduler_built_on_another_optimizer_is_refused(tmp_path):
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(other, 2)
    trainer = make_trainer(tmp_path, lr_config=dict(type='TorchSchedulerHook', scheduler=scheduler))
    with pytest.raises(ConfigError, match="built on another optimizer than the trainer's"):
        trainer.train()
    trainer.close()


@pytest.mark.parametrize('scheduler,message', [
    (dict(type='StepLr', step_size=2), "unknown scheduler type 'StepLr'; closest: StepLR"),
    (dict(type='StepLR', step=2), "StepLR got an unexpected argument 'step'"),
    ('StepLR', 'scheduler must be a torch LRScheduler, a dict(type=...) or a function'),
    (torch.optim.lr_scheduler.ReduceLROnPlateau, 'ReduceLROnPlateau is not supported'),
])
def test_bad_torch_scheduler_config_is_refused(tmp_path, scheduler, message):
    with pytest.raises(ConfigError) as info:
        make_trainer(tmp_path, lr_config=dict(type='TorchSchedulerHook', scheduler=scheduler))
    assert message in str(info.value)
