"""Models and datasets for the checkpoint / resume tests, registered so that config files
written by the tests (run in subprocesses) can name them."""
import random
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from hookloop import Hook
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


class StopAt(Hook):
    """Requests a stop after iteration ``at`` (0-based), as a preemption would; once (a resumed
    run that passes ``at`` again goes on)."""

    def __init__(self, at):
        self.at, self.done = at, False

    def after_train_iter(self, trainer):
        if trainer.iter == self.at and not self.done:
            self.done = True
            trainer.request_stop('test')


class RecordIds(Hook):
    """Per iteration: (epoch, iter, lr of group 0, the batch's sample ids), for data sets whose
    third field is the sample index."""

    PRIORITY = 'LOWEST'

    def __init__(self):
        self.seen = []

    def before_train_iter(self, trainer):
        self.seen.append((trainer.epoch, trainer.iter, trainer.optimizer.param_groups[0]['lr'],
                          trainer.data_batch[2].tolist()))


def assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f'{key} differs'


# -- training in a subprocess ----------------------------------------------------------------
import os  # noqa: E402
import signal  # noqa: E402
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
checkpoint_config = dict(interval={interval}, by_epoch=False{checkpoint_extra})
custom_hooks = [dict(type='EMAHook', momentum=0.2, warm_up=3), dict(type='PreemptionHook')]
log_config = dict(interval=1)
'''


def write_config(directory, big=0, delay=0.0, num_workers=0, max_epochs=4, interval=1, async_save=False):
    path = os.path.join(directory, 'config.py')
    with open(path, 'w') as f:
        f.write(CONFIG.format(big=big, delay=delay, num_workers=num_workers, max_epochs=max_epochs,
                              interval=interval, checkpoint_extra=', async_save=True' if async_save else ''))
    return path


_STARTED = []  # every training process a test started, killed by kill_leftovers()


def kill_leftovers():
    """SIGKILL the training processes a (failed) test left running, with everything they
    started (data loader workers, their forkserver and resource tracker); call after each test."""
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()
        kill_group(process.pid)


def kill_group(pid):
    """SIGKILL what is left of the process group ``pid`` leads (a forked run's own group, see
    :func:`_run_cli`). A run killed with SIGKILL cannot stop its data loader workers: forked
    from a forkserver of the run's own (a forkserver child starts its processes the same way),
    they are the forkserver's children and never see their parent die, and the forkserver and
    its resource tracker wait for them."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_at_first_checkpoint(process, work_dir, timeout):
    """Wait (at most ``timeout`` seconds) until the run ``process`` trains in ``work_dir`` has a
    checkpoint, SIGKILL it there and return the iteration that checkpoint holds. The run must
    still be going when its first checkpoint appears (else its output is the failure)."""
    from hookloop.checkpoint.format import load_checkpoint, read_pointer
    deadline = time.monotonic() + timeout
    while read_pointer(str(work_dir)) is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, process.stdout.read().decode()[-3000:]
    process.send_signal(signal.SIGKILL)
    process.wait()
    return load_checkpoint(read_pointer(str(work_dir)))['meta']['iter']


def launch(config, work_dir):
    """``python -m hookloop train CONFIG --work-dir W --resume auto`` in a new process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, 'tests')]))
    process = subprocess.Popen([sys.executable, '-m', 'hookloop', 'train', config, '--work-dir', str(work_dir),
                                '--resume', 'auto'], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)  # its own group: kill_leftovers ends all it started
    _STARTED.append(process)
    return process


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


def _run_cli(argv, log_path):
    """The child's body: the CLI's ``main`` with fds 1 and 2 sent to ``log_path``, in a
    process group of its own (so :func:`kill_group` ends whatever it started)."""
    os.setpgrp()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, 'w', buffering=1, closefd=False)
    sys.stderr = open(2, 'w', buffering=1, closefd=False)
    from hookloop.cli import main
    sys.exit(main(argv))


_CONTEXT = None


def _context():
    """A forkserver whose server process has imported torch (and torch._dynamo, which the
    first optimizer imports) once: each run forks from that clean, single-threaded process,
    so it starts in milliseconds and cannot inherit a lock held by one of the test process's
    threads (a plain fork of the test process can deadlock)."""
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing
        _CONTEXT = multiprocessing.get_context('forkserver')
        _CONTEXT.set_forkserver_preload(['torch', 'torch._dynamo', 'hookloop.engine.trainer', 'resume_helpers'])
    return _CONTEXT


class ForkedRun:
    """``hookloop train CONFIG --work-dir W --resume auto`` (the CLI's ``main``) in a process
    forked from a forkserver that has torch imported already: the same code path as
    :func:`launch` without seconds of ``import torch`` per run, so a test can afford several
    killed runs. Offers the parts of ``Popen`` the tests use."""

    def __init__(self, config, work_dir, log_path):
        self.log_path = log_path
        argv = ['train', config, '--work-dir', str(work_dir), '--resume', 'auto']
        self.process = _context().Process(target=_run_cli, args=(argv, log_path), daemon=False)
        self.process.start()
        self.pid = self.process.pid
        _STARTED.append(self)

    @property
    def returncode(self):
        return self.process.exitcode

    def poll(self):
        return self.process.exitcode

    def wait(self, timeout=None):
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            kill_group(self.pid)
            raise AssertionError(f'forked training did not finish in {timeout} s')
        kill_group(self.pid)  # a run the test killed leaves its workers behind
        return self.process.exitcode

    def send_signal(self, signum):
        if self.process.exitcode is None:
            os.kill(self.process.pid, signum)

    def kill(self):
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
        kill_group(self.pid)

    def output(self):
        """What the child wrote to stdout and stderr (tracebacks; the trainer's own log is in
        the work dir)."""
        with open(self.log_path, errors='replace') as f:
            return f.read()
