"""Bad schedule configs are refused with one clear ConfigError before any training step."""
import pytest
import torch

from hookloop import ConfigError, Trainer
from hookloop.hooks.lr_updater import OneCycleLrUpdaterHook
from conftest import Regressor
from schedule_recording import make_trainer


def build(tmp_path, **hook_configs):
    return make_trainer(tmp_path, **hook_configs)


@pytest.mark.parametrize('lr_config,message', [
    (dict(policy='Stpe', step=2), "unknown lr policy 'Stpe'; closest: Step"),
    (dict(policy='Step', step=[3, 3]), 'step milestones must be strictly increasing, got [3, 3]'),
    (dict(policy='Step', step=[4, 2]), '(2 follows 4)'),
    (dict(policy='Step', step=0), 'StepLrUpdaterHook: step must be positive, got 0'),
    (dict(policy='Step', step='2'), 'step must be a positive int or an increasing list'),
    (dict(policy='CosineAnnealing', min_lr=0.0, min_lr_ratio=0.1),
     'give exactly one of min_lr and min_lr_ratio (got both'),
    (dict(policy='CosineAnnealing'), 'give exactly one of min_lr and min_lr_ratio (got neither'),
    (dict(policy='FlatCosineAnnealing', min_lr=0.0, min_lr_ratio=0.1), 'give exactly one of min_lr'),
    (dict(policy='FlatCosineAnnealing', min_lr=0.0, start_percent=1), 'start_percent must be a float in [0, 1]'),
    (dict(policy='CosineRestart', periods=[2, 4], restart_weights=[1], min_lr=0.0),
     'restart_weights must be a list with one weight per period (2)'),
    (dict(policy='Fixed', warmup='cosine', warmup_iters=5), "warmup must be None or one of 'constant', 'linear', "
                                                           "'exp', got 'cosine'"),
    (dict(policy='Fixed', warmup='constant', warmup_iters=5, warmup_ratio=0), 'warmup_ratio must be in (0, 1], got 0'),
    (dict(policy='Fixed', warmup='linear', warmup_iters=5, warmup_ratio=-0.1), 'warmup_ratio must be in [0, 1]'),
    (dict(policy='Fixed', warmup='linear', warmup_iters=5, warmup_ratio=1.5), 'warmup_ratio must be in [0, 1]'),
    (dict(policy='Fixed', warmup='linear', warmup_iters=0), 'FixedLrUpdaterHook: warmup_iters must be positive, got 0'),
    (dict(policy='Cyclic', by_epoch=True), 'CyclicLrUpdaterHook works per iteration only: set by_epoch=False'),
    (dict(policy='OneCycle', max_lr=0.1, by_epoch=True), 'OneCycleLrUpdaterHook works per iteration only'),
    (dict(policy='Cyclic', step_ratio_up=1.0), 'step_ratio_up must be in [0, 1), got 1.0'),
    (dict(policy='Cyclic', gamma=0), 'gamma must be in (0, 1], got 0'),
    (dict(policy='Cyclic', target_ratio='10'), "target_ratio must be a number or a pair of numbers, got '10'"),
    (dict(policy='Cyclic', anneal_strategy='cosine'), "anneal_strategy must be 'cos' or 'linear', got 'cosine'"),
    (dict(policy='OneCycle', max_lr=0.1, pct_start=1), 'pct_start must be a float in [0, 1], got 1'),
    (dict(policy='OneCycle', max_lr='0.1'), "max_lr must be a number or a list"),
    (dict(policy='Step', step=2, gama=0.5), "got an unexpected argument 'gama'; did you mean 'gamma'"),
])
def test_bad_lr_config_is_refused_when_the_trainer_is_built(tmp_path, lr_config, message):
    with pytest.raises(ConfigError) as info:
        build(tmp_path, lr_config=lr_config)
    assert message in str(info.value)
    assert '\n' not in str(info.value)


def test_unknown_policy_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        build(tmp_path, lr_config=dict(policy='Triangle'))
    known = str(info.value).split('known policies: ')[1].split(', ')
    for policy in ('Fixed', 'Step', 'Exp', 'Poly', 'Inv', 'CosineAnnealing', 'FlatCosineAnnealing', 'CosineRestart',
                   'Cyclic', 'OneCycle', 'LinearAnnealing'):
        assert policy in known
    with pytest.raises(ConfigError) as info:
        build(tmp_path, momentum_config=dict(policy='Exp'))
    known = str(info.value).split('known policies: ')[1].split(', ')
    assert sorted(known) == ['CosineAnnealing', 'Cyclic', 'LinearAnnealing', 'OneCycle', 'Step']


@pytest.mark.parametrize('momentum_config,message', [
    (dict(policy='Step', step=[2, 1]), 'StepMomentumUpdaterHook: step milestones must be strictly increasing'),
    (dict(policy='CosineAnnealing', min_momentum=0.5, min_momentum_ratio=0.5),
     'give exactly one of min_momentum and min_momentum_ratio'),
    (dict(policy='LinearAnnealing'), 'give exactly one of min_momentum and min_momentum_ratio (got neither'),
    (dict(policy='Cyclic', by_epoch=True), 'CyclicMomentumUpdaterHook works per iteration only'),
    (dict(policy='OneCycle', base_momentum='0.85'), 'base_momentum must be a number or a list'),
    (dict(policy='Step', step=2, warmup='cosine', warmup_iters=3), "got 'cosine'"),
    (dict(policy='Step', step=2, warmup='exp', warmup_iters=3, warmup_ratio=0.0), 'warmup_ratio must be in (0, 1]'),
])
def test_bad_momentum_config_is_refused_when_the_trainer_is_built(tmp_path, momentum_config, message):
    with pytest.raises(ConfigError, match=None) as info:
        build(tmp_path, momentum_config=momentum_config)
    assert message in str(info.value)


@pytest.mark.parametrize('hook_configs,message', [
    (dict(lr_config=dict(policy='OneCycle', max_lr=0.1, total_steps=20)),
     "total_steps=20 is less than the run's max_iters=30"),
    (dict(lr_config=dict(policy='OneCycle', max_lr=[0.1, 0.2, 0.3])),
     'max_lr must be a number or a list of 2 numbers (one per parameter group)'),
    (dict(lr_config=dict(policy='OneCycle', max_lr=0.1, pct_start=1 / 30)),
     'leaves a phase without iterations'),
    (dict(lr_config=dict(policy='CosineRestart', periods=[2, 3], restart_weights=[1, 1], min_lr=0.0)),
     'periods [2, 3] cover 5 epochs but the run has 6'),
    (dict(lr_config=dict(policy='Cyclic', cyclic_times=31)), 'cyclic_times=31 is more than the 30 iterations'),
    (dict(momentum_config=dict(policy='OneCycle', max_momentum=[0.9])), 'max_momentum must be a number or a list of 2'),
])
def test_schedule_that_does_not_fit_the_run_is_refused_before_the_first_step(tmp_path, hook_configs, message):
    trainer = build(tmp_path, **hook_configs)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        trainer.train()
    trainer.close()
    assert message in str(info.value)
    assert trainer.iter == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_one_cycle_without_total_steps_needs_a_run_length(tmp_path):
    # no train_dataloader: the trainer has no max_iters to infer total_steps from
    model = Regressor()
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.1), work_dir=tmp_path, device='cpu', seed=0)
    with pytest.raises(ConfigError, match='total_steps is not given and the run has no max_iters'):
        OneCycleLrUpdaterHook(max_lr=0.1).setup(trainer)
    hook = OneCycleLrUpdaterHook(max_lr=0.1, total_steps=50)
    hook.setup(trainer)  # an explicit total_steps is enough
    trainer.close()


def test_momentum_policy_needs_an_optimizer_with_momentum(tmp_path):
    model = Regressor()
    trainer = Trainer(model, optimizer=dict(type='Adagrad', lr=0.1), work_dir=tmp_path, device='cpu', seed=0,
                      momentum_config=dict(policy='CosineAnnealing', min_momentum=0.8),
                      train_dataloader=torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
                          torch.zeros(4, 4), torch.zeros(4, 1)), batch_size=2), max_epochs=1)
    with pytest.raises(ConfigError, match='parameter group 0 of Adagrad has neither momentum nor betas'):
        trainer.train()
    trainer.close()
