"""Bad input, as a user brings it: every config error and every damaged file is one line,
exit 1, no traceback, and a config error leaves no work dir and no log behind. Errors in
user code keep their traceback under one line saying where they happened."""
import os

import pytest
import torch

from hookloop.checkpoint.checksum import checksum_path
from hookloop.checkpoint.format import POINTER_NAME, load_checkpoint, save_checkpoint
from hookloop.cli import main

BASE = """
custom_imports = ['hookloop.examples.digits', 'bad_input_helpers']
model = dict(type='DigitsMLP', hidden=16)
train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=256, shuffle=True)
optimizer = dict(type='SGD', lr=0.1)
max_epochs = 1
device = 'cpu'
seed = 0
checkpoint_config = dict(interval=1)
"""

# (a line added to the config, what the one-line error must say)
CONFIG_ERRORS = [
    ('evaluation = dict(interval=1)', 'EvaluationHook evaluates, but the trainer has no val_dataloader'),
    ("device = 'cuda'", 'CUDA is not available'),
    ('optimizer = dict(type="SGD", lr=-1)', "optimizer 'SGD': Invalid learning rate: -1"),
    ('train_dataloader["num_workers"] = -1', 'num_workers must be an int >= 0, got -1'),
    ("train_dataloader['shuffle'] = 'no'", "shuffle must be True or False, got 'no'"),
    ("checkpoint_config = dict(interval=1, out_dir='{afile}')", 'is a file, not a directory'),
    ("work_dir = '{afile}'", 'is a file, not a directory'),
    ("resume_policy = 'sometimes'", 'resume_policy must be one of'),
    ("log_config = dict(interval=1, hooks=[dict(type='TextLoggerHook', out_dir='{afile}')])",
     "afile/run' is not writable: it cannot be created"),  # (it copies into <out_dir>/<work dir name>)
]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / 'cfg.py'
    path.write_text(BASE)
    return str(path)


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize('line,message', CONFIG_ERRORS)
def test_config_error_is_one_line_and_writes_nothing(tmp_path, capsys, line, message):
    afile = tmp_path / 'afile'
    afile.write_text('x')
    work_dir = tmp_path / 'run'
    config = tmp_path / 'cfg.py'
    config.write_text(BASE + f"work_dir = {str(work_dir)!r}\n" + line.format(afile=afile) + '\n')
    code, err = run_cli(capsys, 'train', str(config))
    assert code == 1 and message in err, err
    assert len(err.splitlines()) == 1 and 'Traceback' not in err
    assert not work_dir.exists()


def test_non_scalar_loss_is_one_line_naming_the_key_and_shape(tmp_path, capsys, config):
    code, err = run_cli(capsys, 'train', config, '--work-dir', str(tmp_path / 'run'), '--cfg-options',
                        "model={'type':'VectorLossModel'}")
    assert code == 1 and "'loss' at iteration 0 is a tensor of shape (4,), not a scalar" in err, err
    assert len(err.splitlines()) == 1


def test_dataset_error_is_one_line_naming_the_dataset_and_batch(tmp_path, capsys, config):
    code, err = run_cli(capsys, 'train', config, '--work-dir', str(tmp_path / 'run'), '--cfg-options',
                        "train_dataloader.dataset={'type':'BrokenAt','bad':5}", 'train_dataloader.shuffle=False',
                        'train_dataloader.batch_size=4')
    assert code == 1 and len(err.splitlines()) == 1, err
    assert 'BrokenAt raised while loading batch 1 (dataset index 5)' in err and "sample 5 is broken" in err, err


def test_hook_error_keeps_traceback_under_a_line_naming_hook_and_stage(tmp_path, capsys, config):
    with pytest.raises(ZeroDivisionError):
        main(['train', config, '--work-dir', str(tmp_path / 'run'), '--cfg-options',
              "custom_hooks=[{'type':'FailingHook'}]"])
    first = capsys.readouterr().err.splitlines()[0]
    assert first == ('hookloop: error while running FailingHook.after_train_iter at epoch 1, iteration 2: '
                     'ZeroDivisionError: division by zero'), first


def good_checkpoint(tmp_path, config, capsys):
    assert run_cli(capsys, 'train', config, '--work-dir', str(tmp_path / 'src'))[0] == 0
    return tmp_path / 'src' / 'epoch_1.pth'


def damaged_files(tmp_path, good):
    """(name, path to resume from) for each kind of damage."""
    data = good.read_bytes()
    cases = {}

    def write(name, content):
        path = tmp_path / name
        path.write_bytes(content)
        cases[name] = path

    write('zero.pth', b'')
    write('truncated.pth', data[:len(data) // 2])
    write('random.pth', os.urandom(4096))
    write('text.pth', b'not a checkpoint at all\n')
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    write('flipped.pth', bytes(flipped))
    with open(checksum_path(str(good))) as f:
        (tmp_path / os.path.basename(checksum_path('flipped.pth'))).write_text(f.read())
    checkpoint = load_checkpoint(str(good))
    for name, change in [('meta_missing.pth', lambda c: c.pop('meta')),
                         ('meta_wrong.pth', lambda c: c.update(meta={'epoch': 'one'})),
                         ('rng_wrong.pth', lambda c: c.update(rng={'python': 3})),
                         ('weights_wrong.pth', lambda c: c.update(state_dict={'w': torch.ones(2)})),
                         ('list.pth', None)]:
        copy = dict(checkpoint)
        if change is not None:
            change(copy)
        save_checkpoint(copy if change is not None else [1, 2], str(tmp_path / name))
        cases[name] = tmp_path / name
    os.makedirs(tmp_path / 'adir.pth')
    cases['adir.pth'] = tmp_path / 'adir.pth'
    return cases


def test_damaged_checkpoints_given_to_resume_are_one_line_each(tmp_path, capsys, config):
    good = good_checkpoint(tmp_path, config, capsys)
    for name, path in damaged_files(tmp_path, good).items():
        code, err = run_cli(capsys, 'train', config, '--work-dir', str(tmp_path / f'run_{name}'),
                            '--resume', str(path), '--cfg-options', 'max_epochs=2')  # epoch 2 is still to run
        assert code == 1 and len(err.splitlines()) == 1 and 'Traceback' not in err, (name, err)
        assert name in err, (name, err)


@pytest.mark.parametrize('pointer', ['non_utf8', 'directory', 'empty', 'two_lines'])
def test_damaged_pointer_alone_is_one_line(tmp_path, capsys, config, pointer):
    work_dir = tmp_path / 'run'
    work_dir.mkdir()
    target = work_dir / POINTER_NAME
    if pointer == 'directory':
        target.mkdir()
    else:
        target.write_bytes({'non_utf8': b'\xff\xfe', 'empty': b'', 'two_lines': b'a.pth\nb.pth'}[pointer])
    code, err = run_cli(capsys, 'train', config, '--work-dir', str(work_dir), '--resume', 'auto')
    assert code == 1 and len(err.splitlines()) == 1 and POINTER_NAME in err, err
