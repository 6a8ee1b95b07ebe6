"""Hook.next_call: hooks are called at the iterations they name, in their usual place in the
order, and skipping the others changes nothing. The equivalence tests run the built-in hooks
twice, once scheduled and once with the schedule switched off (every hook called at every
iteration, as before the schedule existed), and compare everything the runs leave behind."""
import glob
import json
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data, train_and_close
from hookloop import ConfigError, Hook, Trainer
from hookloop.hooks import NEVER, CheckpointHook, TextLoggerHook
from hookloop.engine.iteration_calls import IterationStage


def make(work_dir, epochs=2, batch_size=4, **kwargs):
    """40 samples / batch 4: 10 iterations per epoch."""
    torch.manual_seed(0)
    if 'max_iters' not in kwargs:
        kwargs.setdefault('max_epochs', epochs)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=DataLoader(regression_data(), batch_size=batch_size, shuffle=True),
                   work_dir=str(work_dir), seed=0, device='cpu', log_level='WARNING', **kwargs)


class Every(Hook):
    """Works every ``n`` iterations (after the 1st, the (n+1)th, ... iteration) and says so."""

    def __init__(self, n, log, label):
        self.n, self.log, self.label = n, log, label

    def next_call(self, trainer, stage, start):
        return start + (-start) % self.n

    def after_train_iter(self, trainer):
        self.log.append((self.label, trainer.iter))


class Always(Hook):
    def __init__(self, log, label):
        self.log, self.label = log, label

    def after_train_iter(self, trainer):
        self.log.append((self.label, trainer.iter))


def test_a_scheduled_hook_is_called_at_its_iterations_in_its_place_in_the_order(tmp_path):
    log = []
    trainer = make(tmp_path)
    trainer.register_hook(Always(log, 'first'), priority='HIGHEST')
    trainer.register_hook(Every(3, log, 'every3'), priority='NORMAL')
    trainer.register_hook(Always(log, 'last'), priority='LOW')
    train_and_close(trainer)
    assert [it for label, it in log if label == 'every3'] == [0, 3, 6, 9, 12, 15, 18]
    for iteration in range(20):
        labels = [label for label, it in log if it == iteration]
        assert labels == (['first', 'every3', 'last'] if iteration % 3 == 0 else ['first', 'last']), iteration


def test_a_resumed_run_asks_again_from_where_it_resumes(tmp_path):
    trainer = make(tmp_path / 'a', checkpoint_config=dict(interval=7, by_epoch=False))
    train_and_close(trainer)
    log = []
    resumed = make(tmp_path / 'a', resume_from=str(tmp_path / 'a' / 'iter_7.pth'))
    resumed.register_hook(Every(5, log, 'every5'))
    train_and_close(resumed)
    assert [it for _, it in log] == [10, 15]  # iterations 7.. of 20: the multiples of 5 among them


class Sleeper(Hook):
    """Never due by its schedule: it runs only when woken. Appends the iterations it ran at."""

    def __init__(self, log):
        self.log = log

    def next_call(self, trainer, stage, start):
        return NEVER

    def after_train_iter(self, trainer):
        self.log.append(trainer.iter)


class Waker(Hook):
    """Wakes ``sleeper`` at the given iterations."""

    def __init__(self, sleeper, at):
        self.sleeper, self.at = sleeper, at

    def after_train_iter(self, trainer):
        if trainer.iter in self.at:
            trainer.wake(self.sleeper)


def test_wake_calls_a_sleeping_hook_at_the_next_iteration(tmp_path):
    log = []
    for sleeper_priority in ('HIGHEST', 'LOW'):  # before or after the waker: the next iteration either way
        log.clear()
        sleeper = Sleeper(log)
        trainer = make(tmp_path / sleeper_priority)
        trainer.register_hook(sleeper, priority=sleeper_priority)
        trainer.register_hook(Waker(sleeper, (4, 11)), priority='NORMAL')
        train_and_close(trainer)
        assert log == [5, 12], sleeper_priority


def test_a_subclass_that_overrides_a_stage_is_called_at_every_iteration(tmp_path):
    """A user's subclass of a built-in hook inherits its next_call, which knows nothing of the
    new method: the method must not be skipped."""
    seen = []

    class EveryIterationCheckpoints(CheckpointHook):  # by_epoch: the parent never runs per iteration
        def after_train_iter(self, trainer):
            seen.append(trainer.iter)

    class CountingLogger(TextLoggerHook):
        def after_train_iter(self, trainer):
            seen.append(('log', trainer.iter))
            super().after_train_iter(trainer)

    trainer = make(tmp_path, epochs=1, checkpoint_config=EveryIterationCheckpoints(interval=1),
                   log_config=dict(interval=5, hooks=[CountingLogger(interval=5)]))
    train_and_close(trainer)
    assert [s for s in seen if not isinstance(s, tuple)] == list(range(10))
    assert [s[1] for s in seen if isinstance(s, tuple)] == list(range(10))


@pytest.mark.parametrize('answer', [-1, 2.5, 'soon', True])
def test_a_next_call_that_names_no_valid_iteration_is_a_config_error(tmp_path, answer):
    class Wrong(Hook):
        def next_call(self, trainer, stage, start):
            return start - 1 if answer == -1 else answer

        def after_train_iter(self, trainer):
            pass

    trainer = make(tmp_path)
    trainer.register_hook(Wrong())
    with pytest.raises(ConfigError, match=r'Wrong\.next_call.*must be None \(every iteration\), NEVER or an '
                                          r'iteration >= 0'):
        train_and_close(trainer)


# -- the built-in hooks: scheduled and unscheduled runs leave the same things behind -----------------------
def unscheduled(monkeypatch):
    """Every hook at every iteration (the schedule switched off)."""
    monkeypatch.setattr(IterationStage, '_ask', lambda self, trainer, index, start: None)


def outcome(work_dir, trainer):
    """What a run leaves: its log records without timings, its files, its whole state (weights,
    optimizer, hook states: EMA averages, best scores, retention lists), paths made relative."""
    with open(sorted(glob.glob(os.path.join(work_dir, '*.log.json')))[-1], encoding='utf-8') as f:
        records = [json.loads(line) for line in f]
    records = [{k: v for k, v in r.items() if k not in ('time', 'data_time')} for r in records if 'mode' in r]
    files = sorted(name for name in os.listdir(work_dir) if name.endswith('.pth') or name == 'last_checkpoint')
    state = trainer.state_dict()
    del state['meta']['time'], state['meta']['run'], state['rng']  # wall-clock times
    return records, files, relative(state, str(work_dir))


def relative(value, work_dir):
    if isinstance(value, dict):
        return {k: relative(v, work_dir) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative(v, work_dir) for v in value]
    if isinstance(value, str):
        return value.replace(work_dir, '<work_dir>')
    return value


def assert_same_tree(a, b, where='state'):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tree(a[key], b[key], f'{where}.{key}')
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for n, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f'{where}[{n}]')
    else:
        assert a == b, where


def assert_same(a, b):
    assert a[0] == b[0]  # the log records
    assert a[1] == b[1]  # the checkpoint files
    assert_same_tree(a[2], b[2])


BY_ITERATION = dict(
    max_iters=23, log_config=dict(interval=3, hooks=[dict(type='TextLoggerHook', by_epoch=False, ignore_last=False)]),
    checkpoint_config=dict(interval=4, by_epoch=False, max_keep_ckpts=2),
    evaluation=dict(interval=5, by_epoch=False, start=2),
    lr_config=dict(policy='step', step=[8], by_epoch=False, warmup='linear', warmup_iters=6),
    custom_hooks=[dict(type='EMAHook', interval=3, warm_up=2), dict(type='CheckInvalidLossHook', interval=2)])
BY_EPOCH = dict(
    max_epochs=3, log_config=dict(interval=4, hooks=[dict(type='TextLoggerHook', ignore_last=False)]),
    checkpoint_config=dict(interval=1, save_best='mse', rule='less'),
    evaluation=dict(interval=1),
    lr_config=dict(policy='step', step=[2], warmup='linear', warmup_iters=7),
    custom_hooks=[dict(type='EMAHook', interval=2, warm_up=1)])


@pytest.mark.parametrize('config', [BY_ITERATION, BY_EPOCH], ids=['by_iteration', 'by_epoch'])
def test_the_built_in_schedules_skip_only_iterations_where_nothing_happens(tmp_path, monkeypatch, config):
    val = dict(val_dataloader=DataLoader(regression_data(n=8, seed=1), batch_size=4),
               val_evaluator=lambda loss, batch: {'mse': loss})
    scheduled = make(tmp_path / 'scheduled', **val, **config)
    train_and_close(scheduled)
    with monkeypatch.context() as patch:
        unscheduled(patch)
        every = make(tmp_path / 'every', **val, **config)
        train_and_close(every)
    a, b = outcome(tmp_path / 'scheduled', scheduled), outcome(tmp_path / 'every', every)
    assert any(r['mode'] == 'val' for r in a[0]) and len([r for r in a[0] if r['mode'] == 'train']) >= 7
    assert_same(a, b)


def test_the_guard_still_stops_at_the_iteration_after_a_logged_nan(tmp_path):
    """FiniteLossGuard is not called per iteration: a new summary wakes it."""

    class NanModel(Regressor):
        calls = 0

        def forward(self, x, y=None):  # the loss of iteration 6 is NaN; it is logged after iteration 8
            loss = super().forward(x, y)
            NanModel.calls += 1
            return loss * float('nan') if NanModel.calls == 7 else loss

    torch.manual_seed(0)
    trainer = Trainer(NanModel(), optimizer=dict(type='SGD', lr=0.05), seed=0, device='cpu', log_level='WARNING',
                      train_dataloader=DataLoader(regression_data(), batch_size=4), max_epochs=2,
                      work_dir=str(tmp_path), log_config=dict(interval=3, hooks=[dict(type='TextLoggerHook')]))
    steps = []

    class CountSteps(Hook):
        RUNS_AFTER = ('optimizer',)

        def after_train_iter(self, trainer):
            steps.append(trainer.iter)

    trainer.register_hook(CountSteps())
    with pytest.raises(Exception, match='non-finite loss'):
        train_and_close(trainer)
    assert steps == list(range(9))  # logged after iteration 8 (index); stopped in iteration 9 before its step
