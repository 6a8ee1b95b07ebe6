"""MMCV 1.7's optimizer API (``mmcv.runner.optimizer``, ``mmcv.utils``) through a rename-only
alias: what MMCV's own tests/test_runner/test_optimizer.py checks, and the import lines of
mmselfsup's optimizer builder and constructor (issue 39, items 6 and 7)."""
import re
import warnings

import pytest
import torch
from torch import nn

from hookloop.errors import ConfigError


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(2, 2, kernel_size=1, groups=2)  # depthwise
        self.gn = nn.GroupNorm(2, 2)
        self.scaling = nn.Parameter(torch.ones(1))


class Net(nn.Module):
    """Parameters of each kind MMCV's rules tell apart, in a known order."""

    def __init__(self):
        super().__init__()
        self.scaling = nn.Parameter(torch.ones(1))
        self.stem = nn.Conv2d(3, 4, kernel_size=1, bias=False)
        self.proj = nn.Conv2d(4, 2, kernel_size=1)
        self.bn = nn.BatchNorm2d(2)
        self.block = Block()

    # the names in MMCV's visiting order: own parameters, then children in order
    NAMES = ['scaling', 'stem.weight', 'proj.weight', 'proj.bias', 'bn.weight', 'bn.bias', 'block.scaling',
             'block.dw.weight', 'block.dw.bias', 'block.gn.weight', 'block.gn.bias']


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = Net()


LR, WD, MOMENTUM = 0.01, 1e-4, 0.9
SGD = dict(type='SGD', lr=LR, weight_decay=WD, momentum=MOMENTUM)
RULES = dict(bias_lr_mult=2, bias_decay_mult=0.5, norm_decay_mult=0, dwconv_decay_mult=0.1)


def expected_groups(bias_lr_mult=1, bias_decay_mult=1, norm_decay_mult=1, dwconv_decay_mult=1, **_):
    """(lr, weight decay) of each parameter of Net under MMCV's paramwise rules."""
    lr_mult = {'proj.bias': bias_lr_mult, 'block.dw.bias': bias_lr_mult}
    wd_mult = {'proj.bias': bias_decay_mult, 'bn.weight': norm_decay_mult, 'bn.bias': norm_decay_mult,
               'block.dw.weight': dwconv_decay_mult, 'block.dw.bias': dwconv_decay_mult,
               'block.gn.weight': norm_decay_mult, 'block.gn.bias': norm_decay_mult}
    return [(LR * lr_mult.get(n, 1), WD * wd_mult.get(n, 1)) for n in Net.NAMES]


def check_one_group(optimizer, model, prefix=''):
    named = dict(model.named_parameters())
    [group] = optimizer.param_groups
    assert [p for p in group['params']] == [named[prefix + n] for n in Net.NAMES]
    assert (optimizer.defaults['lr'], optimizer.defaults['weight_decay'], optimizer.defaults['momentum']) == \
        (LR, WD, MOMENTUM)


def check_rules(optimizer, model, **rules):
    assert [g['params'] for g in optimizer.param_groups] == [[p] for p in model.parameters()]
    assert [(g['lr'], g['weight_decay']) for g in optimizer.param_groups] == expected_groups(**rules)
    assert all(g['momentum'] == MOMENTUM for g in optimizer.param_groups)


def test_default_constructor_follows_mmcvs_rules(mmcv_alias):
    from mmcv.runner import DefaultOptimizerConstructor
    model = Net()
    with pytest.raises(TypeError):
        DefaultOptimizerConstructor([])(model)
    with pytest.raises(TypeError):
        DefaultOptimizerConstructor(dict(lr=1e-4), ['not', 'a', 'dict'])(model)
    with pytest.raises(ValueError):  # a decay multiplier without a weight decay
        DefaultOptimizerConstructor(dict(lr=1e-4, weight_decay=None), dict(norm_decay_mult=1))(model)
    check_one_group(DefaultOptimizerConstructor(SGD)(model), model)
    check_one_group(DefaultOptimizerConstructor(SGD, {})(model), model)
    wrapped = Wrapper()  # a model with .module (MMCV's wrappers): the inner model's parameters
    check_one_group(DefaultOptimizerConstructor(SGD)(wrapped), wrapped, prefix='module.')
    frozen = Net().requires_grad_(False)  # MMCV keeps frozen parameters in the optimizer
    check_one_group(DefaultOptimizerConstructor(SGD)(frozen), frozen)
    check_rules(DefaultOptimizerConstructor(SGD, RULES)(model), model, **RULES)
    check_rules(DefaultOptimizerConstructor(SGD, RULES)(wrapped), wrapped.module, **RULES)
    # frozen parameters: a group each, untouched by the rules
    optimizer = DefaultOptimizerConstructor(SGD, RULES)(frozen)
    assert [(g['lr'], g['weight_decay']) for g in optimizer.param_groups] == [(LR, WD)] * len(Net.NAMES)
    # no weight decay: the learning-rate rules alone (Rprop has no weight_decay)
    optimizer = DefaultOptimizerConstructor(dict(type='Rprop', lr=LR), dict(bias_lr_mult=2))(model)
    assert [g['lr'] for g in optimizer.param_groups] == [lr for lr, _ in expected_groups(bias_lr_mult=2)]


def test_bypass_duplicate_warns_in_mmcvs_words(mmcv_alias):
    from mmcv.runner import DefaultOptimizerConstructor
    model = Net()
    model.twin = nn.Sequential(model.stem)  # the same conv under a second name
    with pytest.raises(ValueError):  # torch: a parameter in two groups
        DefaultOptimizerConstructor(SGD, RULES)(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        optimizer = DefaultOptimizerConstructor(SGD, dict(RULES, bypass_duplicate=True))(model)
    assert [str(w.message) for w in caught] == ['twin.0 is duplicate. It is skipped since bypass_duplicate=True']
    check_rules(optimizer, model, **RULES)


def test_custom_keys(mmcv_alias):
    from mmcv.runner import DefaultOptimizerConstructor
    model = Net()
    with pytest.raises(TypeError):  # MMCV: custom_keys must be a dict
        DefaultOptimizerConstructor(SGD, dict(custom_keys=[0.1, 1e-4]))(model)
    with pytest.raises(ValueError):  # decay_mult without a weight decay
        DefaultOptimizerConstructor(dict(type='SGD', lr=LR), dict(custom_keys={'stem': dict(decay_mult=0.5)}))(model)
    keys = {'scaling': dict(lr_mult=10), 'block': dict(lr_mult=0.1, decay_mult=0), 'block.gn': dict(lr_mult=0.01),
            'absent': dict(lr_mult=0.0)}
    optimizer = DefaultOptimizerConstructor(SGD, dict(custom_keys=keys, norm_decay_mult=0.5))(model)
    got = {name: (g['lr'], g['weight_decay']) for name, g in zip(Net.NAMES, optimizer.param_groups)}
    # the longest key contained in the name wins ('scaling' over 'block' for block.scaling)
    assert got == {'scaling': (LR * 10, WD), 'block.scaling': (LR * 10, WD), 'block.gn.weight': (LR * 0.01, WD),
                   'block.gn.bias': (LR * 0.01, WD), 'block.dw.weight': (LR * 0.1, 0), 'block.dw.bias': (LR * 0.1, 0),
                   'bn.weight': (LR, WD * 0.5), 'bn.bias': (LR, WD * 0.5), 'stem.weight': (LR, WD),
                   'proj.weight': (LR, WD), 'proj.bias': (LR, WD)}
    optimizer = DefaultOptimizerConstructor(dict(type='SGD', lr=LR, momentum=MOMENTUM),
                                            dict(custom_keys={'scaling': dict(lr_mult=10)}))(model)
    assert optimizer.defaults['weight_decay'] == 0
    assert [g['lr'] for g in optimizer.param_groups] == [LR * 10 if n.endswith('scaling') else LR for n in Net.NAMES]


def test_registries_builders_and_utils_import_as_mmcvs(mmcv_alias):
    from mmcv.runner import OPTIMIZER_BUILDERS, OPTIMIZERS, DefaultOptimizerConstructor
    from mmcv.runner.optimizer import build_optimizer, build_optimizer_constructor
    from mmcv.runner.optimizer.builder import TORCH_OPTIMIZERS
    from mmcv.utils import build_from_cfg
    # MMCV registers every torch.optim optimizer class, the abstract Optimizer too
    assert {'ASGD', 'Adadelta', 'Adagrad', 'Adam', 'AdamW', 'Adamax', 'LBFGS', 'Optimizer', 'RMSprop', 'Rprop', 'SGD',
            'SparseAdam'} <= set(TORCH_OPTIMIZERS)
    assert OPTIMIZERS.get('Optimizer') is torch.optim.Optimizer
    model = Net()
    check_rules(build_optimizer_constructor(dict(type='DefaultOptimizerConstructor', optimizer_cfg=SGD,
                                                 paramwise_cfg=RULES))(model), model, **RULES)
    check_one_group(build_optimizer(model, SGD), model)
    check_rules(build_optimizer(model, dict(SGD, paramwise_cfg=RULES)), model, **RULES)

    @OPTIMIZER_BUILDERS.register_module(force=True)
    class StemFaster(DefaultOptimizerConstructor):  # a repository's constructor, its own paramwise key
        def __call__(self, model):
            mult = self.paramwise_cfg.get('stem_lr_mult', 1.)
            groups = [dict(params=[p], **({'lr': self.base_lr * mult} if n.startswith('stem') else {}))
                      for n, p in model.named_parameters()]
            return build_from_cfg(dict(self.optimizer_cfg, params=groups), OPTIMIZERS)

    optimizer = build_optimizer_constructor(dict(type='StemFaster', optimizer_cfg=SGD,
                                                 paramwise_cfg=dict(stem_lr_mult=5)))(model)
    assert [g['lr'] for g in optimizer.param_groups] == [LR * 5 if n == 'stem.weight' else LR for n in Net.NAMES]


def test_build_from_cfg_and_print_log_have_mmcvs_contract(mmcv_alias, capsys, caplog):
    from mmcv.utils import Registry, build_from_cfg, print_log
    things = Registry('thing')

    @things.register_module()
    class Thing:
        def __init__(self, size, colour='red'):
            self.size, self.colour = size, colour

    thing = build_from_cfg(dict(type='Thing', size=2), things, default_args=dict(colour='blue'))
    assert (thing.size, thing.colour) == (2, 'blue')
    assert build_from_cfg(dict(size=1), things, default_args=dict(type=Thing)).size == 1
    with pytest.raises(KeyError, match='no "type"|must contain the key "type"'):
        build_from_cfg(dict(size=1), things)
    with pytest.raises(KeyError, match="'Thng' is not registered in the thing registry; closest: Thing"):
        build_from_cfg(dict(type='Thng', size=1), things)
    with pytest.raises(TypeError):
        build_from_cfg([('type', 'Thing')], things)
    with pytest.raises(TypeError):
        build_from_cfg(dict(type='Thing', size=1), things, default_args=['x'])
    print_log('to stdout')
    print_log('nowhere', logger='silent')
    import logging
    with caplog.at_level(logging.INFO, logger='mmcv-test'):
        print_log('to a logger', logger=logging.getLogger('mmcv-test'))
    assert capsys.readouterr().out == 'to stdout\n' and 'to a logger' in caplog.text
    with pytest.raises(TypeError):
        print_log('x', logger=3)


class LarsLike(torch.optim.SGD):
    """An optimizer registered by a repository (mmselfsup's LARS takes lars_exclude per group)."""

    def __init__(self, params, lr, momentum=0, weight_decay=0, eta=0.001):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def _selfsup_shaped_constructor(OPTIMIZER_BUILDERS, OPTIMIZERS, build_from_cfg, print_log):
    """A constructor written the way mmselfsup 0.x writes its own (re-registered over the
    default with force=True): ``paramwise_cfg`` maps regular expressions of parameter names
    to options, ``<key>_mult`` multiplying the optimizer's value; frozen parameters are kept."""

    @OPTIMIZER_BUILDERS.register_module(force=True)
    class DefaultOptimizerConstructor:
        def __init__(self, optimizer_cfg, paramwise_cfg=None):
            if not isinstance(optimizer_cfg, dict):
                raise TypeError('optimizer_cfg should be a dict')
            self.optimizer_cfg, self.paramwise_cfg = optimizer_cfg, paramwise_cfg or {}

        def __call__(self, model):
            model = getattr(model, 'module', model)
            cfg, groups = dict(self.optimizer_cfg), []
            for name, param in model.named_parameters():
                group = {'params': [param]}
                for pattern, options in self.paramwise_cfg.items() if param.requires_grad else ():
                    if re.search(pattern, name):
                        for key, value in options.items():
                            if key.endswith('_mult'):
                                key, value = key[:-len('_mult')], cfg[key[:-len('_mult')]] * value
                            group[key] = value
                            print_log(f'paramwise_options -- {name}: {key}={value}', logger='silent')
                groups.append(group)
            cfg['params'] = groups
            return build_from_cfg(cfg, OPTIMIZERS)
    return DefaultOptimizerConstructor


def test_mmselfsup_shaped_constructor_and_paramwise_options(mmcv_alias):
    from mmcv.runner.optimizer.builder import OPTIMIZER_BUILDERS, OPTIMIZERS
    from mmcv.utils import build_from_cfg, print_log

    from hookloop.optim.constructor import DefaultOptimizerConstructor as hookloops
    from hookloop.optim.constructor import build_optimizer
    OPTIMIZERS.register_module(module=LarsLike, force=True)
    cfg = dict(type='LarsLike', lr=4.8, momentum=0.9, weight_decay=1e-6,
               paramwise_options={r'(bn|gn)(\d+)?.(weight|bias)': dict(weight_decay=0.),
                                  r'bias': dict(weight_decay=0.), r'\Astem\.': dict(lr_mult=0.5)})
    # hookloop's own (MMCV's) rules do not read mmselfsup's key: one line that says so, not a
    # "did you mean 'params'?" about LarsLike's arguments
    with pytest.raises(ConfigError, match=r"paramwise_options is mmselfsup's key .*custom_imports") as error:
        build_optimizer(Net(), cfg)
    assert 'did you mean' not in str(error.value)
    try:
        _selfsup_shaped_constructor(OPTIMIZER_BUILDERS, OPTIMIZERS, build_from_cfg, print_log)
        model = Net()
        optimizer = build_optimizer(model, cfg)  # hookloop's builder passes it on, as mmselfsup's builder does
    finally:
        OPTIMIZER_BUILDERS.register_module(module=hookloops, force=True)
    got = {name: (g['lr'], g['weight_decay']) for name, g in zip(Net.NAMES, optimizer.param_groups)}
    assert isinstance(optimizer, LarsLike) and got['stem.weight'] == (2.4, 1e-6)
    assert got['bn.weight'] == got['bn.bias'] == got['proj.bias'] == (4.8, 0.)
    assert got['block.gn.weight'] == (4.8, 0.) and got['scaling'] == (4.8, 1e-6)
