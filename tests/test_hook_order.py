"""Priorities, ties, generic stages, role constraints and dispatch of implemented stages only."""
import pytest
import torch

from hookloop import ConfigError, Hook, Priority, Trainer, get_priority
from hookloop.hooks.base import implemented_stages
from hookloop.hooks.order import HookOrderWarning, apply_constraints
from conftest import Regressor, regression_data


class Recorder(Hook):
    """Appends (name, stage) to a shared log at the stages it implements."""

    def __init__(self, name, log):
        self.label, self.log = name, log

    def before_train_iter(self, trainer):
        self.log.append((self.label, 'before_train_iter'))

    def after_train_iter(self, trainer):
        self.log.append((self.label, 'after_train_iter'))


class GenericOnly(Hook):
    def __init__(self, log):
        self.log = log

    def after_iter(self, trainer):
        self.log.append(('generic', trainer.mode))


class NoStages(Hook):
    pass


def make_trainer(tmp_path, **kwargs):
    loader = torch.utils.data.DataLoader(regression_data(n=8), batch_size=4)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader, max_iters=1,
                   work_dir=tmp_path, seed=0, device='cpu', log_level='WARNING', **kwargs)


def first_iteration_order(log, stage):
    return [name for name, s in log if s == stage][:10]


def test_priority_values_and_names():
    assert [p.value for p in Priority] == [0, 10, 30, 40, 50, 60, 70, 90, 100]
    assert get_priority('very_high') == 10 and get_priority(Priority.LOW) == 70 and get_priority(42) == 42
    for bad in ('SOMETIMES', 101, -1, 1.5, True):
        with pytest.raises(ConfigError):
            get_priority(bad)


def test_lower_priority_runs_first_and_ties_keep_registration_order(tmp_path):
    log = []
    trainer = make_trainer(tmp_path)
    trainer.register_hook(Recorder('c_low', log), priority='LOW')
    trainer.register_hook(Recorder('a_normal_1', log))
    trainer.register_hook(Recorder('b_high', log), priority=Priority.HIGH)
    trainer.register_hook(Recorder('a_normal_2', log), priority=50)
    trainer.register_hook({'type': 'IterTimerHook', 'priority': 'HIGHEST'})
    trainer.train()
    expected = ['b_high', 'a_normal_1', 'a_normal_2', 'c_low']
    assert first_iteration_order(log, 'before_train_iter') == expected
    assert first_iteration_order(log, 'after_train_iter') == expected
    assert [type(h).__name__ for h in trainer.hooks][:2] == ['IterTimerHook', 'Recorder']


def test_generic_stage_serves_train_and_val(tmp_path):
    log = []
    trainer = make_trainer(tmp_path, val_dataloader=torch.utils.data.DataLoader(regression_data(n=8), batch_size=4))
    trainer.register_hook(GenericOnly(log))
    trainer.train()  # one training iteration, then the default EvaluationHook validates (2 batches)
    assert log == [('generic', 'train'), ('generic', 'val'), ('generic', 'val')]


def test_only_implementing_hooks_are_dispatched(tmp_path):
    assert implemented_stages(NoStages()) == []
    assert implemented_stages(GenericOnly([])) == ['after_train_iter', 'after_val_iter']
    trainer = make_trainer(tmp_path)
    idle = trainer.register_hook(NoStages())
    trainer.resolve_hooks()
    for methods in trainer._dispatch.values():
        assert all(getattr(m, '__self__', None) is not idle for m in methods)


class Role(Hook):
    def __init__(self, role, after=(), before=()):
        self.ROLE, self.RUNS_AFTER, self.RUNS_BEFORE = role, after, before

    @property
    def name(self):
        return self.ROLE

    def after_train_epoch(self, trainer):
        pass


def test_constraints_move_hook_just_ahead_of_partner():
    hooks = [Role('checkpoint'), Role('logger', after=('*',)), Role('x'), Role('ema', before=('checkpoint',))]
    assert [h.ROLE for h in apply_constraints(hooks)] == ['ema', 'checkpoint', 'x', 'logger']


def test_ema_runs_before_checkpoint_even_when_lowest(tmp_path):
    trainer = make_trainer(tmp_path)
    order = []

    class Ema(Hook):
        ROLE = 'ema'
        RUNS_BEFORE = ('checkpoint',)

        def after_train_iter(self, trainer):
            order.append('ema')

    class Ckpt(Hook):
        ROLE = 'checkpoint'

        def after_train_iter(self, trainer):
            order.append('checkpoint')
    trainer.register_hook(Ckpt(), priority='NORMAL')
    with pytest.warns(HookOrderWarning, match=r'Ema \(priority LOWEST\) runs before Ckpt \(priority NORMAL\)'):
        trainer.register_hook(Ema(), priority='LOWEST')
    trainer.train()
    assert order == ['ema', 'checkpoint']
    assert 'Ema' in trainer.hook_order_table().split('after_train_iter:')[1].split('Ckpt')[0]


def test_second_optimizer_hook_refused_naming_both(tmp_path):
    trainer = make_trainer(tmp_path, optimizer_config=dict())
    with pytest.raises(ConfigError, match='cannot register OptimizerHook: OptimizerHook is already registered'):
        trainer.register_hook(dict(type='OptimizerHook'))


def test_register_hook_rejects_non_hooks(tmp_path):
    trainer = make_trainer(tmp_path)
    with pytest.raises(ConfigError, match='must be a hookloop.Hook or a config dict'):
        trainer.register_hook(object())
    with pytest.raises(ConfigError, match="'NoSuchHook' is not registered in the hook registry"):
        trainer.register_hook(dict(type='NoSuchHook'))
