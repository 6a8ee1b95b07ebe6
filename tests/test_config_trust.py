"""Configs that may come from elsewhere run no code, and no config expands without bound.

``.json`` / ``.yaml`` files (a model hub's ``configuration.json``) never run Python: a ``.py``
``_base_`` reached from one is refused, however it is spelled; a ``.py`` config keeps MMCV's
rights. YAML aliases, ``_base_`` fan-out and depth, nesting and file size are bounded, each
with one line (``hookloop/config/bounds.py``).
"""
import json
import os

import pytest

from hookloop.cli import main
from hookloop.config import bounds
from hookloop.config.loader import load_config
from hookloop.errors import ConfigError

TRAIN = dict(custom_imports=['hookloop.examples.digits'], model=dict(type='DigitsMLP', hidden=8),
             train_dataloader=dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=256),
             optimizer=dict(type='SGD', lr=0.1), max_iters=2, device='cpu', seed=0,
             log_config=dict(interval=100), checkpoint_config=dict(interval=1, by_epoch=False))


def python_base(tmp_path):
    """A ``.py`` config that leaves a marker when it runs."""
    marker = tmp_path / 'ran'
    path = tmp_path / 'evil.py'
    path.write_text(f"open({str(marker)!r}, 'w').close()\nlr = 0.5\n")
    return path, marker


def write(path, data):
    path.write_text(json.dumps(data) if path.suffix == '.json' else _yaml(data))
    return path


def _yaml(data):
    import yaml
    return yaml.safe_dump(data)


@pytest.mark.parametrize('ext', ['.json', '.yaml'])
@pytest.mark.parametrize('spelling', ['relative', 'absolute', 'dotdot', 'upper-case', 'through a json base'])
def test_a_data_config_never_runs_a_python_base(tmp_path, ext, spelling):
    evil, marker = python_base(tmp_path)
    sub = tmp_path / 'hub' / 'model'
    sub.mkdir(parents=True)
    names = {'relative': '../../evil.py', 'absolute': str(evil), 'dotdot': '../../hub/../evil.py'}
    if spelling == 'upper-case':
        os.rename(evil, tmp_path / 'EVIL.PY')
        base = str(tmp_path / 'EVIL.PY')
    elif spelling == 'through a json base':
        base = str(write(sub / 'middle.json', {'_base_': str(evil), 'x': 1}))
    else:
        base = names[spelling]
    config = write(sub / f'configuration{ext}', {'_base_': base, 'y': 2})
    with pytest.raises(ConfigError, match=r'names .* as a _base_: a \.json/\.yaml config .* never runs Python') as refused:
        load_config(config)
    assert '\n' not in str(refused.value)
    assert not marker.exists()


def test_a_python_config_keeps_mmcvs_rights(tmp_path):
    """``.py`` over ``.py`` and over ``.json``: as before. A ``.py`` reached through a json
    base of a ``.py`` config is still refused (the json may have come from elsewhere)."""
    evil, marker = python_base(tmp_path)
    write(tmp_path / 'data.json', {'model': {'depth': 18}})
    (tmp_path / 'top.py').write_text("_base_ = ['evil.py', 'data.json']\nbatch = 4\n")
    assert load_config(tmp_path / 'top.py') == {'lr': 0.5, 'model': {'depth': 18}, 'batch': 4}
    assert marker.exists()
    marker.unlink()
    write(tmp_path / 'data2.json', {'_base_': 'evil.py'})
    (tmp_path / 'top2.py').write_text("_base_ = 'data2.json'\n")
    with pytest.raises(ConfigError, match='never runs Python'):
        load_config(tmp_path / 'top2.py')
    assert not marker.exists()


def laughs(levels, width=9):
    """YAML in which each level is a list of ``width`` aliases of the level before."""
    lines = [f'l0: &l0 [{", ".join(["lol"] * width)}]']
    lines += [f'l{i}: &l{i} [{", ".join([f"*l{i - 1}"] * width)}]' for i in range(1, levels)]
    return '\n'.join(lines) + '\n'


def test_yaml_aliases_are_bounded_and_refused_through_the_cli(tmp_path, capsys):
    """~600 bytes of YAML that expand to 9**9 values: before, a 31 MB checkpoint (or minutes)."""
    config = tmp_path / 'laughs.yaml'
    config.write_text(_yaml(TRAIN) + laughs(9))
    assert len(config.read_bytes()) < 1200
    code = main(['train', str(config), '--work-dir', str(tmp_path / 'work')])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and 'expands to more than' in err, err
    assert not any(name.endswith('.pth') for name in os.listdir(tmp_path)) and not (tmp_path / 'work').exists()


def test_yaml_aliases_below_the_bound_still_load(tmp_path):
    config = tmp_path / 'some.yaml'
    config.write_text(laughs(4))
    assert len(load_config(config)['l3']) == 9


def test_base_fan_out_and_depth_are_bounded(tmp_path):
    """21 files each naming the next twice (2**21 reads before: over 120 s); 20 in a chain."""
    for i in range(21):
        write(tmp_path / f'f{i}.json', {'_base_': [f'f{i + 1}.json'] * 2, f'k{i}': i} if i < 20 else {'k20': 20})
    with pytest.raises(ConfigError, match='reads more than|chains _base_ more than'):
        load_config(tmp_path / 'f0.json')
    with pytest.raises(ConfigError, match=f'reads more than {bounds.MAX_FILES} files through _base_'):
        load_config(tmp_path / 'f10.json')  # 10 levels: within the depth, 2**10 reads
    for i in range(20):
        write(tmp_path / f'c{i}.yaml', {'_base_': f'c{i + 1}.yaml'} if i < 19 else {'end': True})
    with pytest.raises(ConfigError, match=f'chains _base_ more than {bounds.MAX_BASE_DEPTH} files deep'):
        load_config(tmp_path / 'c0.yaml')
    assert load_config(tmp_path / 'c5.yaml') == {'end': True}


def test_nesting_size_and_many_values_are_bounded(tmp_path):
    deep = {}
    node = deep
    for _ in range(bounds.MAX_DEPTH + 5):
        node['x'] = {}
        node = node['x']
    with pytest.raises(ConfigError, match='nests values more than'):
        load_config(write(tmp_path / 'deep.json', deep))
    with pytest.raises(ConfigError, match='expands to more than'):
        load_config(write(tmp_path / 'wide.json', {'v': list(range(bounds.MAX_VALUES))}))
    big = tmp_path / 'big.json'
    big.write_text('{"v": "' + 'x' * bounds.MAX_FILE_BYTES + '"}')
    with pytest.raises(ConfigError, match='larger than 4 MiB'):
        load_config(big)
    many = [write(tmp_path / f'part{i}.json', {f'p{i}': list(range(bounds.MAX_VALUES // 3))}) for i in range(4)]
    write(tmp_path / 'all.json', {'_base_': [p.name for p in many]})
    with pytest.raises(ConfigError, match='the merged config of .* expands to more than'):
        load_config(tmp_path / 'all.json')


def test_a_real_config_with_bases_loads_as_before(tmp_path):
    write(tmp_path / 'model.yaml', {'model': {'type': 'DigitsMLP', 'hidden': 8}})
    write(tmp_path / 'data.json', {'train_dataloader': TRAIN['train_dataloader']})
    (tmp_path / 'schedule.py').write_text("optimizer = dict(type='SGD', lr=0.1)\nmax_iters = 2\n")
    rest = {k: v for k, v in TRAIN.items() if k not in ('model', 'train_dataloader', 'optimizer', 'max_iters')}
    (tmp_path / 'top.py').write_text(f"_base_ = ['model.yaml', 'data.json', 'schedule.py']\n"
                                     + ''.join(f'{k} = {v!r}\n' for k, v in rest.items()))
    assert load_config(tmp_path / 'top.py') == TRAIN
    assert main(['train', str(tmp_path / 'top.py'), '--work-dir', str(tmp_path / 'work')]) == 0
