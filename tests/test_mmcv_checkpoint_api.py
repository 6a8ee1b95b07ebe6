"""MMCV 1.7's checkpoint functions (``mmcv.runner.checkpoint``, ``mmcv.parallel``) through a
rename-only alias: what MMCV's own tests/test_runner/test_checkpoint.py checks (its Petrel
part aside), every load ``weights_only``."""
import os
import re
import sys
from collections import OrderedDict
from unittest.mock import MagicMock

import pytest
import torch
from torch import nn

from hookloop.errors import ConfigError


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.norm = nn.BatchNorm2d(3)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.conv = nn.Conv2d(3, 3, 1)


KEYS = {'block.conv.weight', 'block.conv.bias', 'block.norm.weight', 'block.norm.bias', 'block.norm.running_mean',
        'block.norm.running_var', 'block.norm.num_batches_tracked', 'conv.weight', 'conv.bias'}


class Holder:
    """A wrapper class user code registers in MODULE_WRAPPERS (not even an nn.Module)."""

    def __init__(self, module):
        self.module = module


@pytest.fixture
def registered_holder(mmcv_alias):
    from mmcv.parallel.registry import MODULE_WRAPPERS
    MODULE_WRAPPERS.register_module(module=Holder, force=True)
    yield Holder
    del MODULE_WRAPPERS._modules['Holder']


def same_tensors(state, model_state):
    return all(torch.equal(state[key], model_state[key]) for key in model_state)


def test_get_state_dict_leaves_every_wrapper_out(registered_holder):
    from mmcv.parallel import MMDataParallel
    from mmcv.runner.checkpoint import get_state_dict
    model = Model()
    for wrapped in (model, registered_holder(model), MMDataParallel(model)):
        state = get_state_dict(wrapped)
        assert isinstance(state, OrderedDict) and set(state) == KEYS and same_tensors(state, model.state_dict())
    holder = registered_holder(model)
    for name, child in list(model._modules.items()):  # wrapped children keep their own names
        model._modules[name] = torch.nn.DataParallel(child)
    assert set(get_state_dict(holder)) == KEYS


def test_load_checkpoint_revise_keys_and_prefix(mmcv_alias, tmp_path):
    from mmcv.runner.checkpoint import _load_checkpoint_with_prefix, load_checkpoint

    class WithBackbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = Model()

    plain, prefixed, path = Model(), WithBackbone(), str(tmp_path / 'weights.pth')
    torch.save(plain.state_dict(), path)
    loaded = load_checkpoint(prefixed, path, revise_keys=[(r'^', 'backbone.')])
    assert same_tensors(loaded, prefixed.backbone.state_dict())  # returned: the file's content
    torch.save(prefixed.state_dict(), path)
    loaded = load_checkpoint(plain, path, revise_keys=[(r'^backbone\.', '')])
    assert same_tensors({re.sub(r'^backbone\.', '', k): v for k, v in loaded.items()}, plain.state_dict())
    conv = _load_checkpoint_with_prefix('backbone.conv', path)
    assert set(conv) == {'weight', 'bias'} and torch.equal(conv['weight'], prefixed.backbone.conv.weight)
    with pytest.raises(AssertionError):
        _load_checkpoint_with_prefix('head', path)


def test_module_versions_convert_old_checkpoints(mmcv_alias, tmp_path):
    from mmcv.runner import load_checkpoint, save_checkpoint

    class Old(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(2, 2), nn.Linear(2, 2)

    class New(nn.Module):
        _version = 2  # renamed its layers: converts version-1 checkpoints when loading them

        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
            if local_metadata.get('version', 1) < 2:
                for old, new in (('first', 'a'), ('second', 'b')):
                    for key in [k for k in state_dict if k.startswith(prefix + old)]:
                        state_dict[key.replace(old, new, 1)] = state_dict.pop(key)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    old, new = Old(), New()
    save_checkpoint(old, str(tmp_path / 'v1.pth'))
    load_checkpoint(new, str(tmp_path / 'v1.pth'))
    assert torch.equal(new.a.weight, old.first.weight) and torch.equal(new.b.weight, old.second.weight)
    other = New()
    save_checkpoint(other, str(tmp_path / 'v2.pth'))
    load_checkpoint(new, str(tmp_path / 'v2.pth'))
    assert torch.equal(new.a.weight, other.a.weight)


def test_classes_in_meta_through_wrappers(registered_holder, tmp_path):
    from mmcv.runner import load_checkpoint, save_checkpoint
    path = str(tmp_path / 'c.pth')
    for wrap in (lambda m: m, registered_holder):
        model = Model()
        save_checkpoint(wrap(model), path)
        assert 'CLASSES' not in load_checkpoint(wrap(model), path)['meta']
        model.CLASSES = ('cat', 'dog')
        save_checkpoint(wrap(model), path)
        assert load_checkpoint(wrap(model), path)['meta']['CLASSES'] == ('cat', 'dog')


def test_checkpoint_loader_schemes(mmcv_alias, tmp_path):
    from mmcv.runner import CheckpointLoader, _load_checkpoint, save_checkpoint
    path = str(tmp_path / 'c.pth')
    save_checkpoint(Model(), path)
    assert 'CLASSES' not in _load_checkpoint(path)['meta']
    expected = {'http://x/y.pth': 'load_from_http', 'https://x/y.pth': 'load_from_http',
                'modelzoo://x': 'load_from_torchvision', 'torchvision://resnet50': 'load_from_torchvision',
                'open-mmlab://x': 'load_from_openmmlab', 'openmmlab://x': 'load_from_openmmlab',
                'mmcls://x': 'load_from_mmcls', 'pavi://x': 'load_from_pavi', 's3://b/k.pth': 'load_from_ceph',
                'ss3://b/k.pth': 'load_from_local', ' s3://b/k.pth': 'load_from_local',
                'open-mmlab:s3://b/k.pth': 'load_from_ceph', 'openmmlabs3://b/k.pth': 'load_from_local',
                ':s3://b/k.path': 'load_from_local', 'relative/dir/k.pth': 'load_from_local'}
    assert {f: CheckpointLoader._get_checkpoint_loader(f).__name__ for f in expected} == expected
    saved = dict(CheckpointLoader._schemes)
    try:
        @CheckpointLoader.register_scheme(prefixes='ftp://')
        def load_from_ftp(filename, map_location):
            return dict(filename=filename)
        assert CheckpointLoader._get_checkpoint_loader('ftp://h/k.pth') is load_from_ftp
        with pytest.raises(KeyError):
            CheckpointLoader.register_scheme('ftp://', lambda f, m: None)
        CheckpointLoader.register_scheme('ftp://', lambda f, m: dict(forced=f), force=True)
        assert CheckpointLoader.load_checkpoint('ftp://h/k.pth') == dict(forced='ftp://h/k.pth')
        CheckpointLoader.register_scheme('a/b', lambda f, m: 'ab')
        CheckpointLoader.register_scheme('a/b/c', lambda f, m: 'abc')
        assert CheckpointLoader.load_checkpoint('a/b/c/d') == 'abc'  # the longer prefix first
    finally:
        CheckpointLoader._schemes = saved
    # the schemes hookloop cannot serve say so in one line
    for refused in ('open-mmlab://resnet50_v1c', 'mmcls://resnet50', 'open-mmlab:s3://bucket/k.pth'):
        with pytest.raises(ConfigError, match='not|ship'):
            CheckpointLoader.load_checkpoint(refused)


def test_pavi_loader(mmcv_alias, monkeypatch):
    from mmcv.runner.checkpoint import load_from_pavi
    pavi = MagicMock()
    monkeypatch.setitem(sys.modules, 'pavi', pavi)
    pavi.modelcloud.get.return_value = MagicMock(download=lambda path: None)  # downloads nothing
    pavi.modelcloud.get.return_value.name = 'model.pth'
    with pytest.raises(AssertionError):
        load_from_pavi('folder/model.pth')
    with pytest.raises(FileNotFoundError):
        load_from_pavi('pavi://folder/model.pth')


def test_save_checkpoint(mmcv_alias, tmp_path, monkeypatch):
    from mmcv.runner.checkpoint import load_from_local, save_checkpoint
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(TypeError):
        save_checkpoint(model, str(tmp_path / 'x.pth'), meta='not a dict')
    assert not os.path.exists(tmp_path / 'x.pth')
    save_checkpoint(model, str(tmp_path / 'a.pth'))
    save_checkpoint(model, str(tmp_path / 'b.pth'), optimizer)
    save_checkpoint(model, str(tmp_path / 'c.pth'), meta={'note': 'kept'})
    save_checkpoint(model, str(tmp_path / 'd.pth'), file_client_args={'backend': 'disk'})
    with pytest.raises(ConfigError, match="backend 'petrel' is not supported"):
        save_checkpoint(model, str(tmp_path / 'e.pth'), file_client_args={'backend': 'petrel'})
    monkeypatch.setenv('HOME', str(tmp_path))
    assert torch.load(tmp_path / 'b.pth', weights_only=True)['optimizer']['param_groups'][0]['lr'] == 0.1
    assert load_from_local('~/c.pth', map_location=None)['meta']['note'] == 'kept'
    assert same_tensors(load_from_local('~/d.pth', None)['state_dict'], model.state_dict())
