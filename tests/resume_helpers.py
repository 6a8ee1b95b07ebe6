"""Models and datasets for the checkpoint / resume tests, registered so that config files
written by the tests (run in subprocesses) can name them."""
import random
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from hookloop.registry import DATASETS, MODELS


@DATASETS.register_module()
class AugmentedRegression(Dataset):
    """Regression samples with a random augmentation drawn from torch, NumPy and Python's
    ``random`` (so every generator a user might use must be reproduced on resume).
    ``calls`` counts ``__getitem__`` in this process; ``delay`` slows each sample down."""

    def __init__(self, n=48, features=4, seed=0, delay=0.0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=generator)
        self.y = (self.x @ torch.arange(1.0, features + 1)).unsqueeze(1)
        self.delay = delay
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        noise = 0.05 * torch.randn(self.x.shape[1]) + 0.01 * float(np.random.rand()) + 0.01 * random.random()
        return self.x[index] + noise, self.y[index]


@MODELS.register_module()
class DropoutRegressor(nn.Module):
    """``model(x, y)`` -> MSE loss, with dropout so that the torch RNG matters in training.
    ``big`` adds a frozen buffer of that many float32 values (to make large checkpoints)."""

    def __init__(self, features=4, hidden=16, big=0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        if big:
            self.register_buffer('ballast', torch.zeros(big))

    def forward(self, x, y=None):
        prediction = self.net(x)
        if y is None:
            return prediction
        return nn.functional.mse_loss(prediction, y)


def assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f'{key} differs'


# -- training in a subprocess ----------------------------------------------------------------
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = '''custom_imports = ['resume_helpers']
model = dict(type='DropoutRegressor', big={big})
optimizer = dict(type='SGD', lr=0.05, momentum=0.9)
train_dataloader = dict(dataset=dict(type='AugmentedRegression', n=40, delay={delay}), batch_size=8,
                        shuffle=True, num_workers={num_workers})
max_epochs = {max_epochs}
seed = 0
device = 'cpu'
checkpoint_config = dict(interval={interval}, by_epoch=False)
custom_hooks = [dict(type='EMAHook', momentum=0.2, warm_up=3), dict(type='PreemptionHook')]
log_config = dict(interval=1)
'''


def write_config(directory, big=0, delay=0.0, num_workers=0, max_epochs=4, interval=1):
    path = os.path.join(directory, 'config.py')
    with open(path, 'w') as f:
        f.write(CONFIG.format(big=big, delay=delay, num_workers=num_workers, max_epochs=max_epochs,
                              interval=interval))
    return path


def launch(config, work_dir):
    """``python -m hookloop train CONFIG --work-dir W --resume auto`` in a new process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, 'tests')]))
    return subprocess.Popen([sys.executable, '-m', 'hookloop', 'train', config, '--work-dir', str(work_dir),
                             '--resume', 'auto'], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def reference_run(config, work_dir, options=()):
    """The same config trained in this process without interruption (and without the delay)."""
    from hookloop.cli import build_from_config
    trainer = build_from_config(config, ['train_dataloader.dataset.delay=0', *options], work_dir=str(work_dir))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def comparable(checkpoint):
    """Model, EMA and optimizer tensors of a checkpoint, flat, for a bitwise comparison."""
    state = {f'model.{k}': v for k, v in checkpoint['state_dict'].items()}
    state.update({f'ema.{k}': v for k, v in checkpoint['ema_state_dict'].items()})
    for index, values in checkpoint['optimizer']['state'].items():
        state.update({f'optim.{index}.{k}': v for k, v in values.items() if hasattr(v, 'shape')})
    return state


class ForkedRun:
    """``hookloop train CONFIG --work-dir W --resume auto`` in a forked copy of this process.

    The same CLI code path as :func:`launch`, without paying for a fresh interpreter and
    ``import torch`` (seconds on a loaded machine), so a test can afford several killed runs.
    Offers the parts of ``Popen`` the tests use."""

    def __init__(self, config, work_dir, log_path):
        self.returncode = None
        self.log_path = log_path
        self.pid = os.fork()
        if self.pid == 0:  # the child: train, then leave without running the parent's clean-up
            code = 1
            try:
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                from hookloop.cli import main
                code = main(['train', config, '--work-dir', str(work_dir), '--resume', 'auto'])
            except BaseException:  # noqa: B036 - report anything, then exit
                import traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                self.send_signal(9)
                raise AssertionError(f'forked training did not finish in {timeout} s')
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            os.kill(self.pid, signum)

    def output(self):
        """What the child wrote to file descriptors 1 and 2 (tracebacks; the trainer's own
        log is in the work dir)."""
        with open(self.log_path, errors='replace') as f:
            return f.read()
