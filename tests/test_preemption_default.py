"""Preemption without registering anything: the shipped example saves on SIGTERM / SIGINT
and resumes exactly; under torchrun every rank stops after the same iteration."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as torch_dist
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from resume_helpers import ROOT, _context, _run_cli, assert_states_equal, kill_leftovers

EXAMPLE = os.path.join(ROOT, 'configs', 'digits_mlp.py')
# A log line every 5 iterations; the test waits for the first one, which reaches the .log file
# at the first flush point (the end of epoch 1 at the latest): eight short epochs leave the
# signal time to land while training runs (with two, the second could end first).
OPTIONS = ['max_epochs=8', 'log_config.interval=5']


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    kill_leftovers()


def forked_cli(argv, log_path):
    """``hookloop ARGV`` in a process forked from the preloaded forkserver (fast start)."""
    process = _context().Process(target=_run_cli, args=(argv, log_path), daemon=False)
    process.start()
    return process


def work_dir_log(work_dir):
    text = ''
    if os.path.isdir(work_dir):
        for name in os.listdir(work_dir):
            if name.endswith('.log'):
                with open(os.path.join(work_dir, name), errors='replace') as f:
                    text += f.read()
    return text


def final_tensors(path):
    checkpoint = load_checkpoint(path)
    state = {f'model.{k}': v for k, v in checkpoint['state_dict'].items()}
    for index, values in checkpoint['optimizer']['state'].items():
        state.update({f'optim.{index}.{k}': v for k, v in values.items() if hasattr(v, 'shape')})
    return state


@pytest.fixture(scope='module')
def example_reference(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('reference')
    process = forked_cli(['train', EXAMPLE, '--work-dir', str(work_dir), '--cfg-options', *OPTIONS],
                         str(work_dir / 'out.txt'))
    process.join(300)
    assert process.exitcode == 0, open(work_dir / 'out.txt').read()[-3000:]
    return final_tensors(str(work_dir / 'epoch_8.pth'))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_shipped_example_saves_exits_zero_and_resumes_exactly(tmp_path, signum, example_reference):
    work_dir = tmp_path / 'run'
    argv = ['train', EXAMPLE, '--work-dir', str(work_dir), '--resume', 'auto', '--cfg-options', *OPTIONS]
    process = forked_cli(argv, str(tmp_path / 'first.txt'))
    deadline = time.monotonic() + 240
    while 'Epoch [1][5/' not in work_dir_log(work_dir):
        assert process.exitcode is None and time.monotonic() < deadline, open(tmp_path / 'first.txt').read()
        time.sleep(0.05)
    os.kill(process.pid, signum)
    process.join(120)
    output = open(tmp_path / 'first.txt').read()
    assert process.exitcode == 0, output[-3000:]
    assert 'Traceback' not in output
    pointer = read_pointer(work_dir)
    assert os.path.basename(pointer).startswith('preempt_iter_'), output[-3000:]
    assert f'{signal.Signals(signum).name}: saved {pointer}' in work_dir_log(work_dir)
    resumed = forked_cli(argv, str(tmp_path / 'second.txt'))
    resumed.join(300)
    assert resumed.exitcode == 0, open(tmp_path / 'second.txt').read()[-3000:]
    assert_states_equal(final_tensors(str(work_dir / 'epoch_8.pth')), example_reference)


class SignalAt(Hook):
    def __init__(self, at, signum=signal.SIGTERM):
        self.at, self.signum = at, signum

    def before_train_iter(self, trainer):
        if trainer.iter == self.at:
            os.kill(os.getpid(), self.signum)


def make_trainer(work_dir, hooks=(), **kwargs):
    torch.manual_seed(0)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), max_epochs=2, work_dir=work_dir, seed=0,
                   train_dataloader=DataLoader(regression_data(), batch_size=8), device='cpu',
                   log_config=dict(interval=100), checkpoint_config=dict(interval=1), custom_hooks=list(hooks),
                   **kwargs)


def test_preemption_is_on_by_default_with_a_checkpoint_hook_and_forgets_the_signal(tmp_path):
    trainer = make_trainer(tmp_path, hooks=[SignalAt(3)])
    previous = signal.getsignal(signal.SIGTERM)
    trainer.train()
    assert trainer.iter == 4 and read_pointer(tmp_path) == str(tmp_path / 'preempt_iter_4.pth')
    assert signal.getsignal(signal.SIGTERM) is previous
    preemption = next(h for h in trainer.hooks if type(h).__name__ == 'PreemptionHook')
    assert preemption.received is None  # forgotten: a second train() runs to the end
    trainer.close()
    resumed = make_trainer(tmp_path, resume_from='auto')
    resumed.train()
    resumed.close()
    assert resumed.iter == 10


def test_no_checkpoint_hook_means_no_signal_handler(tmp_path):
    trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), max_epochs=1, work_dir=tmp_path,
                      train_dataloader=DataLoader(regression_data(), batch_size=8), device='cpu')
    assert 'PreemptionHook' not in trainer.hook_order_table()
    trainer.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(not (torch_dist.is_available() and torch_dist.is_gloo_available()), reason='needs gloo')
def test_sigterm_to_torchrun_stops_every_rank_at_the_same_iteration_and_exits_zero(tmp_path):
    worker = os.path.join(ROOT, 'tests', 'dist', 'preempt_worker.py')
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', worker,
               str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1')
    agent = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not all((tmp_path / f'started_rank{r}').exists() for r in (0, 1)):
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()[0][-3000:]
            time.sleep(0.05)
        time.sleep(0.3)
        signalled = time.time()
        agent.send_signal(signal.SIGTERM)
        output = agent.communicate(timeout=60)[0]
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    records = [json.loads((tmp_path / f'rank{r}.json').read_text()) for r in (0, 1)]
    assert [r['status'] for r in records] == [0, 0], output[-3000:]
    assert records[0]['iter'] == records[1]['iter'] > 3, records
    assert max(r['time'] for r in records) - signalled < 15, records
    saved = load_checkpoint(read_pointer(tmp_path / 'work'))
    assert saved['meta']['iter'] == records[0]['iter']


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_second_ctrl_c_during_the_save_aborts_without_a_traceback(tmp_path):
    from resume_helpers import ForkedRun, write_config
    config = write_config(tmp_path, big=50_000_000, delay=0.01, max_epochs=4, interval=1000)  # 200 MB saves
    work_dir = tmp_path / 'run'
    run = ForkedRun(config, work_dir, str(tmp_path / 'out.txt'))
    deadline = time.monotonic() + 180
    while 'Epoch [' not in work_dir_log(work_dir):
        assert run.poll() is None and time.monotonic() < deadline, run.output()[-3000:]
        time.sleep(0.02)
    run.send_signal(signal.SIGINT)
    while not any(n.startswith('.preempt_iter_') for n in os.listdir(work_dir)):  # the save has begun
        assert run.poll() is None and time.monotonic() < deadline, run.output()[-3000:]
        time.sleep(0.002)
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == -signal.SIGINT
    assert 'Traceback' not in run.output()
    assert read_pointer(work_dir) is None  # nothing half-written became the latest
    assert not [n for n in os.listdir(work_dir) if n.startswith('preempt_iter_')]
