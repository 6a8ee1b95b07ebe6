import json

import pytest

from hookloop import Config, ConfigError, load_config
from hookloop.config.loader import parse_options, set_dotted


def write(path, text):
    path.write_text(text)
    return str(path)


def test_python_config_with_base_inheritance(tmp_path):
    write(tmp_path / 'base.py', "optimizer = dict(type='SGD', lr=0.1, momentum=0.9)\nmax_epochs = 3\n"
                                "log_config = dict(interval=10, hooks=[dict(type='TextLoggerHook')])\n")
    path = write(tmp_path / 'child.py', "_base_ = './base.py'\nimport math\n_helper = 2\n"
                                        "optimizer = dict(lr=0.01)\nmax_epochs = _helper * 2\n")
    cfg = Config.fromfile(path)
    assert cfg.optimizer == {'type': 'SGD', 'lr': 0.01, 'momentum': 0.9}
    assert cfg.optimizer.lr == 0.01  # dotted access
    assert cfg.max_epochs == 4
    assert '_helper' not in cfg and 'math' not in cfg
    assert cfg.log_config.hooks[0].type == 'TextLoggerHook'


def test_delete_replaces_base_dict(tmp_path):
    write(tmp_path / 'base.yaml', 'optimizer: {type: SGD, lr: 0.1, momentum: 0.9}\n')
    path = write(tmp_path / 'child.yaml', "_base_: base.yaml\noptimizer: {_delete_: true, type: Adam, lr: 0.001}\n")
    assert load_config(path)['optimizer'] == {'type': 'Adam', 'lr': 0.001}


def test_yaml_and_json(tmp_path):
    yaml_path = write(tmp_path / 'a.yaml', 'max_iters: 10\noptimizer:\n  type: SGD\n  lr: 0.5\n')
    json_path = write(tmp_path / 'a.json', json.dumps({'max_iters': 10, 'optimizer': {'type': 'SGD', 'lr': 0.5}}))
    assert load_config(yaml_path) == load_config(json_path) == {'max_iters': 10, 'optimizer': {'type': 'SGD', 'lr': 0.5}}


def test_cfg_options_parse_literals_and_strings():
    options = parse_options(['optimizer.lr=0.01', 'max_epochs=3', 'name=abc', 'steps=[1, 2]', 'flag=True',
                             'pair=(1, 2)', 'nested={"a": 1}', 'none=None', "quoted='x=y'"])
    assert options == {'optimizer.lr': 0.01, 'max_epochs': 3, 'name': 'abc', 'steps': [1, 2], 'flag': True,
                       'pair': (1, 2), 'nested': {'a': 1}, 'none': None, 'quoted': 'x=y'}


def test_set_dotted_creates_and_indexes_lists():
    cfg = Config(dict(log_config=dict(hooks=[dict(type='TextLoggerHook')])))
    set_dotted(cfg, 'log_config.hooks.0.interval', 5)
    set_dotted(cfg, 'optimizer.lr', 0.1)
    assert cfg.log_config.hooks[0].interval == 5 and cfg.optimizer.lr == 0.1
    with pytest.raises(ConfigError, match='not an index'):
        set_dotted(cfg, 'log_config.hooks.3.interval', 1)


@pytest.mark.parametrize('name,text,message', [
    ('missing.py', None, 'does not exist'),
    ('empty.py', '', 'is empty'),
    ('broken.py', 'model = dict(\n', 'does not parse'),
    ('broken.yaml', 'a: [1, 2\n', 'does not parse'),
    ('broken.json', '{"a": ', 'does not parse'),
    ('list.yaml', '- 1\n- 2\n', 'must hold a mapping'),
    ('config.toml', 'a = 1', 'unsupported extension'),
])
def test_bad_config_files(tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_cfg_option_without_equals():
    with pytest.raises(ConfigError, match="'optimizer.lr' has no \"=\""):
        parse_options(['optimizer.lr'])
