"""paramwise_cfg, constructor= and several optimizers, with MMCV 1.x's DefaultOptimizerConstructor rules."""
import pytest
import torch
from torch import nn

from hookloop import ConfigError
from hookloop.engine.builder import build_optimizer
from hookloop.optim.constructor import OPTIMIZER_CONSTRUCTORS, DefaultOptimizerConstructor, OptimizerDict


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)                            # weight, bias
        self.bn = nn.BatchNorm2d(4)                                # weight, bias
        self.dwconv = nn.Conv2d(4, 4, 3, groups=4, bias=False)     # depthwise: weight
        self.head = nn.Sequential(nn.Linear(4, 2))                 # custom key 'head'
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


PARAMWISE = dict(bias_lr_mult=2., bias_decay_mult=0.5, norm_decay_mult=0., dwconv_decay_mult=0.1,
                 custom_keys={'head': dict(lr_mult=10., decay_mult=0.5)})


def groups_of(optimizer, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return [(names[id(g['params'][0])], g['lr'], g['weight_decay']) for g in optimizer.param_groups]


def test_paramwise_groups_equal_mmcv():
    model = Net()
    optimizer = build_optimizer(dict(type='SGD', lr=0.01, weight_decay=0.001, momentum=0.9,
                                     paramwise_cfg=PARAMWISE), model)
    # Written out from MMCV's documented rules: one group per parameter, in module order;
    # biases get bias_lr_mult/bias_decay_mult, except a norm's bias (norm decay) and custom keys (which win).
    got = groups_of(optimizer, model)
    expected = [('conv1.weight', 0.01, 0.001), ('conv1.bias', 0.02, 0.0005), ('bn.weight', 0.01, 0.0),
                ('bn.bias', 0.01, 0.0), ('dwconv.weight', 0.01, 0.0001), ('head.0.weight', 0.1, 0.0005),
                ('head.0.bias', 0.1, 0.0005), ('frozen.weight', 0.01, 0.001), ('frozen.bias', 0.01, 0.001)]
    assert [g[0] for g in got] == [e[0] for e in expected]
    for (_, lr, wd), (name, want_lr, want_wd) in zip(got, expected):
        assert lr == pytest.approx(want_lr) and wd == pytest.approx(want_wd), name


def test_longest_custom_key_wins():
    model = Net()
    keys = {'conv': dict(lr_mult=2.), 'dwconv': dict(lr_mult=3.)}
    optimizer = build_optimizer(dict(type='SGD', lr=1.0, paramwise_cfg=dict(custom_keys=keys)), model)
    lrs = {name: lr for name, lr, _ in groups_of(optimizer, model)}
    assert lrs['dwconv.weight'] == 3.0 and lrs['conv1.weight'] == 2.0 and lrs['bn.weight'] == 1.0


def test_decay_mult_without_weight_decay_is_refused():
    with pytest.raises(ConfigError, match='norm_decay_mult.*no weight_decay'):
        build_optimizer(dict(type='SGD', lr=0.1, paramwise_cfg=dict(norm_decay_mult=0.)), Net())


def test_bypass_duplicate_skips_shared_parameters():
    model = Net()
    model.tied = nn.Linear(4, 2)
    model.tied.weight = model.head[0].weight
    with pytest.raises(ValueError):  # torch refuses a parameter in two groups
        build_optimizer(dict(type='SGD', lr=0.1, paramwise_cfg=dict(bias_lr_mult=2.)), model)
    # MMCV's words (its own test_optimizer.py matches them): the module's name
    with pytest.warns(UserWarning, match='^tied is duplicate. It is skipped since bypass_duplicate=True$'):
        optimizer = build_optimizer(dict(type='SGD', lr=0.1, paramwise_cfg=dict(bypass_duplicate=True)), model)
    assert sum(len(g['params']) for g in optimizer.param_groups) == len(list(model.parameters()))


def test_registered_constructor():
    @OPTIMIZER_CONSTRUCTORS.register_module(force=True)
    class HeadOnlyConstructor(DefaultOptimizerConstructor):
        def __call__(self, model):
            return torch.optim.SGD(model.head.parameters(), lr=self.base_lr)

    model = Net()
    optimizer = build_optimizer(dict(type='SGD', lr=0.5, constructor='HeadOnlyConstructor'), model)
    assert [p for g in optimizer.param_groups for p in g['params']] == list(model.head.parameters())


def test_one_optimizer_per_named_submodule():
    model = Net()
    optimizer = build_optimizer(dict(conv1=dict(type='Adam', lr=1e-3), head=dict(type='SGD', lr=0.1)), model)
    assert isinstance(optimizer, OptimizerDict) and set(optimizer) == {'conv1', 'head'}
    assert list(optimizer['head'].param_groups[0]['params']) == list(model.head.parameters())
    assert [g['lr'] for g in optimizer.param_groups] == [1e-3, 0.1]
    with pytest.raises(ConfigError, match=r"sub-modules \['generator'\]"):
        build_optimizer(dict(generator=dict(type='Adam', lr=1e-3)), model)
