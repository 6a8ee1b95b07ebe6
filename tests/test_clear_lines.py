"""Clear lines instead of tracebacks (issue 20, item 8), and warnings for silent surprises (item 9)."""
import errno
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Trainer
from hookloop.checkpoint.format import save_checkpoint
from hookloop.errors import CheckpointError, ConfigError


def make_trainer(work_dir, model=None, optimizer=None, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8)
    return Trainer(model or Regressor(), optimizer=optimizer or dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=loader, max_epochs=kwargs.pop('epochs', 1), work_dir=work_dir, seed=0,
                   device='cpu', log_config=dict(interval=100), checkpoint_config=dict(interval=1), **kwargs)


def test_eio_on_the_directory_fsync_does_not_claim_the_previous_file_is_kept(tmp_path, monkeypatch):
    import hookloop.checkpoint.format as checkpoint
    path = tmp_path / 'c.pth'
    save_checkpoint({'a': 1}, str(path))
    real_fsync = os.fsync

    def failing(fd):
        if os.path.isdir(f'/proc/self/fd/{fd}'):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)
    monkeypatch.setattr(checkpoint.os, 'fsync', failing)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint({'a': 2}, str(path))
    message = str(info.value)
    assert 'previous checkpoint is kept' not in message and 'renamed into place' in message
    assert 'Input/output error' in message
    assert torch.load(path, weights_only=True) == {'a': 2}


def test_an_adam_checkpoint_resumed_into_sgd_is_one_line_before_any_step(tmp_path):
    train(make_trainer(tmp_path / 'adam', optimizer=dict(type='Adam', lr=0.01)))
    sgd = make_trainer(tmp_path / 'sgd', epochs=2, resume_from=str(tmp_path / 'adam' / 'epoch_1.pth'))
    with pytest.raises(CheckpointError, match=r"another kind of optimizer than this run's SGD.*momentum"):
        train(sgd)


class FloatLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x, y):
        return {'loss': float(((self.linear(x) - y) ** 2).mean())}


def test_a_float_loss_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"'loss' at iteration 0 is a Python float .* carries no gradient"):
        train(make_trainer(tmp_path / 'run', model=FloatLoss()))


@pytest.mark.parametrize('value', [[1], 5, [None]])
def test_custom_imports_that_are_not_names_are_one_line(tmp_path, value):
    with pytest.raises(ConfigError, match='custom_imports must be'):
        make_trainer(tmp_path / 'run', custom_imports=value)


def test_a_string_lr_names_lr(tmp_path):
    with pytest.raises(ConfigError, match=r"optimizer 'SGD': lr must be a number, got 'fast'"):
        make_trainer(tmp_path / 'run', optimizer=dict(type='SGD', lr='fast'))


def test_a_full_disk_says_no_space_left(tmp_path, monkeypatch):
    """torch's zip writer turns the file's ENOSPC into "enforce fail ... unexpected pos"."""
    import io
    real_fdopen = os.fdopen

    class Full(io.RawIOBase):
        def __init__(self, file):
            self.file, self.written = file, 0

        def writable(self):
            return True

        def write(self, data):
            self.written += len(data)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.file.write(data)

        def fileno(self):
            return self.file.fileno()

        def close(self):
            self.file.close()

    monkeypatch.setattr(os, 'fdopen', lambda fd, mode='r', *a, **k: Full(real_fdopen(fd, mode, *a, **k)))
    with pytest.raises(CheckpointError, match='No space left on device; the previous checkpoint is kept') as info:
        save_checkpoint({'w': torch.zeros(10000)}, str(tmp_path / 'c.pth'))
    assert 'enforce fail' not in str(info.value)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == []  # the temporary is gone


# -- item 9: silent surprises get a warning ------------------------------------------------------

def test_a_checkpoint_without_rng_resumes_with_a_warning(tmp_path, capsys):
    from hookloop.checkpoint.format import load_checkpoint
    train(make_trainer(tmp_path / 'src'))
    checkpoint = load_checkpoint(str(tmp_path / 'src' / 'epoch_1.pth'))
    del checkpoint['rng']
    save_checkpoint(checkpoint, str(tmp_path / 'norng.pth'))
    capsys.readouterr()
    train(make_trainer(tmp_path / 'dst', epochs=2, resume_from=str(tmp_path / 'norng.pth')))
    assert 'has no "rng" entry' in capsys.readouterr().out


def test_a_memory_work_dir_from_the_cli_warns_that_it_is_lost(tmp_path, capsys):
    from hookloop.cli import main
    config = tmp_path / 'cfg.py'
    config.write_text("custom_imports = ['hookloop.examples.digits']\nmodel = dict(type='DigitsMLP', hidden=8)\n"
                      "train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=512)\n"
                      "optimizer = dict(type='SGD', lr=0.1)\nmax_iters = 1\ndevice = 'cpu'\nseed = 0\n")
    assert main(['train', str(config), '--work-dir', 'memory://hookloop-i20-cli/run']) == 0
    assert "in this process's memory: its checkpoints are lost" in capsys.readouterr().out
    import fsspec
    fs = fsspec.filesystem('memory')
    if fs.exists('/hookloop-i20-cli'):
        fs.rm('/hookloop-i20-cli', recursive=True)


def test_the_store_going_away_is_one_line(tmp_path, monkeypatch):
    """botocore's EndpointConnectionError (the S3 server gone) came through as a traceback."""
    botocore = pytest.importorskip('botocore.exceptions')
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem
    url = 'memory://hookloop-i20-gone/run'
    trainer = make_trainer(url, epochs=2)

    def gone(*args, **kwargs):
        raise botocore.EndpointConnectionError(endpoint_url='http://127.0.0.1:9')
    monkeypatch.setattr(MemoryFileSystem, '_open', gone)
    try:
        with pytest.raises(CheckpointError, match=r'could not write checkpoint .*Could not connect to the endpoint') \
                as info:
            train(trainer)
        assert '\n' not in str(info.value)
        monkeypatch.setattr(MemoryFileSystem, 'exists', gone)
        with pytest.raises(CheckpointError, match=r"storage .* failed: Could not connect"):
            train(make_trainer(url, resume_from='auto'))
    finally:
        monkeypatch.undo()
        fs = fsspec.filesystem('memory')
        if fs.exists('/hookloop-i20-gone'):
            fs.rm('/hookloop-i20-gone', recursive=True)


SIGNAL_HOOK = '''
import atexit, os, signal
from hookloop import Hook
from hookloop.registry import HOOKS

@HOOKS.register_module()
class SignalTwice(Hook):
    """SIGINT at iteration 2 (the preemption save follows), then again at exit."""
    def after_train_iter(self, trainer):
        if trainer.iter == 2:
            os.kill(os.getpid(), signal.SIGINT)
    def after_run(self, trainer):
        atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))
'''


def test_a_second_sigint_after_the_preempt_save_prints_no_keyboard_interrupt(tmp_path):
    import subprocess
    import sys
    (tmp_path / 'signal_twice.py').write_text(SIGNAL_HOOK)
    (tmp_path / 'cfg.py').write_text(
        "custom_imports = ['hookloop.examples.digits', 'signal_twice']\nmodel = dict(type='DigitsMLP', hidden=8)\n"
        "train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=64)\n"
        "optimizer = dict(type='SGD', lr=0.1)\nmax_iters = 20\ndevice = 'cpu'\nseed = 0\n"
        "custom_hooks = [dict(type='PreemptionHook'), dict(type='SignalTwice', priority='LOWEST')]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get('PYTHONPATH', '')]))
    done = subprocess.run([sys.executable, '-m', 'hookloop', 'train', str(tmp_path / 'cfg.py'), '--work-dir',
                           str(tmp_path / 'run')], env=env, capture_output=True, text=True, timeout=120)
    assert 'KeyboardInterrupt' not in done.stderr and 'Traceback' not in done.stderr, done.stderr
    assert (tmp_path / 'run' / 'preempt_iter_3.pth').exists()
