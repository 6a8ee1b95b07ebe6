"""The CLI: training from a config, and one clear line (no traceback, nothing trained) for bad input."""
import os
import subprocess
import sys

import pytest

from hookloop.cli import main

BASE = """
custom_imports = ['hookloop.examples.digits']
model = dict(type='DigitsMLP', hidden=16)
train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=256, shuffle=True)
optimizer = dict(type='SGD', lr=0.1)
max_epochs = 1
device = 'cpu'
seed = 0
checkpoint_config = dict(interval=1)
"""


def write_config(tmp_path, text=BASE, name='cfg.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip()


def trained(work_dir):
    return os.path.exists(work_dir) and any(name.endswith('.pth') for name in os.listdir(work_dir))


def test_train_and_hooks_commands(tmp_path, capsys):
    cfg = write_config(tmp_path)
    work_dir = str(tmp_path / 'run')
    assert main(['train', cfg, '--work-dir', work_dir, '--cfg-options', 'optimizer.lr=0.05']) == 0
    assert trained(work_dir) and os.path.exists(os.path.join(work_dir, 'last_checkpoint'))
    capsys.readouterr()
    assert main(['hooks', cfg]) == 0
    table = capsys.readouterr().out
    assert 'after_train_iter:' in table and 'OptimizerHook' in table and 'TextLoggerHook' in table
    after_iter = table.split('after_train_iter:')[1].split(':')[0]
    assert after_iter.index('OptimizerHook') < after_iter.index('TextLoggerHook')
    assert 'IterTimerHook' in table.split('before_train_epoch:')[1].split(':')[0]


@pytest.mark.parametrize('edit,message', [
    (BASE + "custom_hooks = [dict(type='EMAHok')]", "'EMAHok' is not registered in the hook registry"),
    (BASE.replace("type='SGD'", "type='SDG'"), "'SDG' is not registered in the optimizer registry; closest: SGD"),
    (BASE.replace("type='DigitsMLP'", "type='DigitMLP'"), "'DigitMLP' is not registered in the model registry"),
    (BASE + "custom_hooks = [dict(type='CheckpointHook', intervall=2)]", "CheckpointHook got an unexpected argument 'intervall'"),
    (BASE + "max_iters = 10", 'give exactly one of max_epochs and max_iters'),
    (BASE.replace('max_epochs = 1', ''), 'give exactly one of max_epochs and max_iters'),
    (BASE.replace("batch_size=256, shuffle=True", "batch_size=4096, shuffle=True, drop_last=True"),
     'train_dataloader is empty'),
    (BASE + "max_epoch = 3", "Trainer got an unexpected argument 'max_epoch'; did you mean 'max_epochs'"),
    (BASE + "log_config = dict(interval=0, hooks=[dict(type='TextLoggerHook')])", 'interval must be a positive int, got 0'),
])
def test_bad_config_values(tmp_path, capsys, edit, message):
    work_dir = str(tmp_path / 'run')
    code, err = run_cli(capsys, 'train', write_config(tmp_path, edit), '--work-dir', work_dir)
    assert code == 1 and message in err, err
    assert err.startswith('hookloop: error:') and '\n' not in err and 'Traceback' not in err
    assert not trained(work_dir)


@pytest.mark.parametrize('name,text,message', [
    ('missing.py', None, 'does not exist'),
    ('empty.py', '', 'is empty'),
    ('broken.py', 'model = dict(', 'does not parse'),
    ('wrong.yaml', 'model: {type: DigitsMLP}\nmax_epochs: ten\n', "max_epochs must be a positive int, got 'ten'"),
])
def test_bad_config_files(tmp_path, capsys, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    code, err = run_cli(capsys, 'train', str(path), '--work-dir', str(tmp_path / 'run'))
    assert code == 1 and message in err, err


def test_bad_command_line(tmp_path, capsys):
    cfg = write_config(tmp_path)
    work_dir = str(tmp_path / 'run')
    code, err = run_cli(capsys, 'train', cfg, '--work-dir', work_dir, '--cfg-options', 'optimizer.lr')
    assert code == 1 and "'optimizer.lr' has no \"=\"" in err
    code, err = run_cli(capsys, 'train', cfg, '--work-dir', work_dir, '--resume', str(tmp_path / 'nope.pth'))
    assert code == 1 and 'nope.pth' in err and 'does not exist' in err
    not_a_checkpoint = tmp_path / 'notes.pth'
    not_a_checkpoint.write_text('hello')
    code, err = run_cli(capsys, 'train', cfg, '--work-dir', work_dir, '--resume', str(not_a_checkpoint))
    assert code == 1 and 'not a readable checkpoint' in err, err
    code, err = run_cli(capsys, 'train', cfg, '--work-dir', str(not_a_checkpoint / 'sub'))
    assert code == 1 and 'is not writable' in err
    assert not trained(work_dir)


def test_errors_print_no_traceback_from_the_real_command(tmp_path):
    cfg = write_config(tmp_path, BASE + "custom_hooks = [dict(type='EMAHok')]")
    result = subprocess.run([sys.executable, '-m', 'hookloop', 'train', cfg, '--work-dir', str(tmp_path / 'r')],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().startswith('hookloop: error:') and 'Traceback' not in result.stderr
    debug = subprocess.run([sys.executable, '-m', 'hookloop', '--debug', 'train', cfg, '--work-dir', str(tmp_path / 'r')],
                           capture_output=True, text=True, timeout=120)
    assert debug.returncode != 0 and 'Traceback' in debug.stderr
