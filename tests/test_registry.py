import pytest
import torch

from hookloop import HOOKS, OPTIMIZERS, ConfigError, Hook, Registry


def test_register_as_decorator_call_and_alias():
    registry = Registry('thing')

    @registry.register_module()
    class Alpha:
        def __init__(self, size=1):
            self.size = size

    @registry.register_module(module_name='Renamed')
    class Beta:
        pass

    class Gamma:
        pass
    registry.register_module(module=Gamma)
    registry.register_module(Gamma, module_name='GammaToo')

    assert registry.get('Alpha') is Alpha and registry.get('Renamed') is Beta
    assert registry.get('Gamma') is Gamma and registry.get('GammaToo') is Gamma
    assert registry.build(dict(type='Alpha', size=3)).size == 3
    assert registry.build(dict(type=Alpha)).size == 1
    assert registry.build(dict(type='Alpha'), size=5).size == 5


def test_duplicate_name_needs_force():
    registry = Registry('thing')

    @registry.register_module()
    class Alpha:
        pass

    with pytest.raises(ConfigError, match="'Alpha' is already registered in the thing registry"):
        @registry.register_module(module_name='Alpha')
        class Other:
            pass

    @registry.register_module(module_name='Alpha', force=True)
    class Replacement:
        pass
    assert registry.get('Alpha') is Replacement


def test_unknown_type_names_registry_and_closest_names():
    with pytest.raises(ConfigError) as info:
        HOOKS.build(dict(type='EMAHok'))
    message = str(info.value)
    assert "'EMAHok' is not registered in the hook registry" in message
    with pytest.raises(ConfigError, match="closest: .*OptimizerHook"):
        HOOKS.build(dict(type='OptimiserHook'))
    with pytest.raises(ConfigError, match="closest: .*AdamW"):
        OPTIMIZERS.build(dict(type='adamw', lr=1), params=[torch.nn.Parameter(torch.zeros(1))])


def test_bad_keyword_names_class_and_keyword():
    with pytest.raises(ConfigError) as info:
        HOOKS.build(dict(type='TextLoggerHook', intervall=5))
    message = str(info.value)
    assert 'TextLoggerHook' in message and "'intervall'" in message and "'interval'" in message


def test_all_torch_optimizers_registered():
    for name in ('SGD', 'Adam', 'AdamW', 'RMSprop', 'Adagrad', 'LBFGS', 'Adadelta', 'Adamax', 'NAdam', 'RAdam'):
        assert issubclass(OPTIMIZERS.get(name), torch.optim.Optimizer)
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = OPTIMIZERS.build(dict(type='SGD', lr=0.1, momentum=0.9), params=params)
    assert optimizer.param_groups[0]['momentum'] == 0.9


def test_hook_registry_builds_user_hooks():
    @HOOKS.register_module(force=True)
    class CountingHook(Hook):
        def __init__(self, every=2):
            self.every = every
    assert HOOKS.build(dict(type='CountingHook', every=3)).every == 3
