"""PreemptionHook: SIGTERM / SIGINT finish the iteration, save, exit 0; resume continues exactly;
a second signal aborts at once."""
import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import ConfigError
from hookloop.hooks import PreemptionHook
from resume_helpers import (ForkedRun, assert_states_equal, comparable, kill_leftovers, launch, reference_run,
                            write_config)


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    kill_leftovers()


class SignalAt(Hook):
    """Sends ``signum`` to this process in the middle of iteration ``at`` (0-based)."""

    def __init__(self, at, signum):
        self.at, self.signum = at, signum

    def before_train_iter(self, trainer):
        if trainer.iter == self.at:
            os.kill(os.getpid(), self.signum)


def make_trainer(work_dir, extra_hooks=(), **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8, shuffle=True)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=2, work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   custom_hooks=[dict(type='PreemptionHook'), *extra_hooks], **kwargs)


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_iteration_saves_and_resume_matches(tmp_path, signum):
    reference = make_trainer(tmp_path / 'ref')
    reference.train()
    reference.close()
    previous = signal.getsignal(signum)
    trainer = make_trainer(tmp_path / 'run', extra_hooks=[SignalAt(6, signum)])
    trainer.train()  # returns normally
    trainer.close()
    assert trainer.stop_reason == f'received {signal.Signals(signum).name}'
    assert trainer.iter == 7  # iteration 6 was completed, none after it
    assert signal.getsignal(signum) is previous  # handlers restored
    path = tmp_path / 'run' / 'preempt_iter_7.pth'
    assert read_pointer(tmp_path / 'run') == str(path)
    assert load_checkpoint(str(path))['meta']['inner_iter'] == 2
    resumed = make_trainer(tmp_path / 'run', auto_resume=True)
    resumed.train()
    resumed.close()
    assert_states_equal(resumed.model.state_dict(), reference.model.state_dict())


def test_preemption_hook_refuses_unknown_signals():
    with pytest.raises(ConfigError, match=r"PreemptionHook signals: unknown \['SIGFOO'\]"):
        PreemptionHook(signals=['SIGTERM', 'SIGFOO'])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_cli_process_saves_exits_zero_and_resume_auto_finishes_exactly(tmp_path):
    config = write_config(tmp_path, delay=0.01, max_epochs=4, interval=1000)  # ~0.1 s per iteration
    work_dir = tmp_path / 'run'
    process = launch(config, work_dir)  # a real `python -m hookloop train` process
    deadline = time.monotonic() + 240
    while 'Epoch [' not in _log(work_dir):  # an iteration was logged: training is under way
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0].decode(errors='replace')
    assert process.returncode == 0, output[-3000:]
    pointer = read_pointer(str(work_dir))
    assert os.path.basename(pointer).startswith('preempt_iter_'), output[-3000:]
    stopped_at = load_checkpoint(pointer)['meta']['iter']
    assert 0 < stopped_at < 20
    assert f'SIGTERM: saved {pointer}' in _log(work_dir)
    resumed = ForkedRun(config, work_dir, str(tmp_path / 'resumed.log'))
    assert resumed.wait(timeout=180) == 0, resumed.output()[-3000:]
    final = load_checkpoint(read_pointer(str(work_dir)))
    reference = reference_run(config, tmp_path / 'reference')
    assert_states_equal(comparable(final), comparable(load_checkpoint(read_pointer(str(reference.work_dir)))))


def test_second_signal_aborts_at_once_without_saving(tmp_path):
    config = write_config(tmp_path, delay=0.2, max_epochs=1, interval=1000)  # 1.6 s per iteration
    work_dir = tmp_path / 'run'
    process = ForkedRun(config, work_dir, str(tmp_path / 'run.log'))
    deadline = time.monotonic() + 120
    while 'Epoch [' not in _log(work_dir):  # iteration 0 is done: handlers are in place, iteration 1 runs
        assert process.poll() is None and time.monotonic() < deadline, process.output()[-3000:]
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    assert read_pointer(str(work_dir)) is None
    assert not [n for n in os.listdir(work_dir) if n.startswith('preempt')]


def _log(work_dir):
    if not os.path.isdir(work_dir):
        return ''
    text = ''
    for name in os.listdir(work_dir):
        if name.endswith('.log'):
            with open(os.path.join(work_dir, name), errors='replace') as f:
                text += f.read()
    return text
