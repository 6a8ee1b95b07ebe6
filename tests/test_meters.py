import os
import subprocess
import sys

import pytest
import torch

from hookloop.meters import MeterBuffer


def test_summary_gives_interval_mean_and_latest():
    values = torch.randn(7, generator=torch.Generator().manual_seed(0))
    meters = MeterBuffer()
    for value in values:
        meters.update('loss', value)
        meters.update('time', float(value) + 1)
    summary = meters.summary()
    assert summary['loss']['avg'] == pytest.approx(values.mean().item(), abs=1e-6)
    assert summary['loss']['latest'] == values[-1].item()
    assert summary['loss']['count'] == 7
    assert summary['time']['avg'] == pytest.approx(values.mean().item() + 1, abs=1e-6)


def test_marks_let_each_logger_average_its_own_interval():
    meters = MeterBuffer()
    first = meters.mark()
    for n in range(10):
        meters.update('loss', torch.tensor(float(n)))
        if n == 4:
            every_5 = meters.mark()
    assert meters.summary(first)['loss']['avg'] == 4.5  # 0..9
    assert meters.summary(every_5)['loss']['avg'] == 7.0  # 5..9
    assert meters.summary(meters.mark()) == {}  # nothing new since


def test_reserve_keeps_a_long_interval():
    meters = MeterBuffer(history=4)
    meters.reserve(20)
    mark = meters.mark()
    for n in range(20):
        meters.update('loss', torch.tensor(float(n)))
    assert meters.summary(mark)['loss'] == {'avg': 9.5, 'latest': 19.0, 'count': 20}
    short = MeterBuffer(history=4)
    for n in range(20):
        short.update('loss', torch.tensor(float(n)))
    assert short.summary()['loss']['count'] == 4  # history bounds memory


def test_summary_is_one_host_copy_and_cached(monkeypatch):
    meters = MeterBuffer()
    for n in range(50):
        for key in ('loss', 'loss_a', 'loss_b', 'grad_norm'):
            meters.update(key, torch.tensor(float(n)))
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, 'tolist', lambda self: calls.append(1) or original(self))
    monkeypatch.setattr(torch.Tensor, 'item', lambda self: pytest.fail('item() called'))
    first = meters.summary()
    assert meters.summary() is first  # same state: no second copy
    assert len(calls) == 1
    meters.update('loss', torch.tensor(0.0))
    meters.summary()
    assert len(calls) == 2


def test_clear_forgets_values():
    meters = MeterBuffer()
    meters.update('loss', torch.tensor(1.0))
    mark = meters.mark()
    meters.clear()
    assert meters.summary() == {} and meters.summary(mark) == {}
    meters.update('loss', torch.tensor(3.0))
    assert meters.summary(mark)['loss']['avg'] == 3.0


DIST_SCRIPT = '''
import torch, torch.distributed as dist
from hookloop.meters import MeterBuffer
dist.init_process_group('gloo')
rank = dist.get_rank()
meters = MeterBuffer()
for n in range(4):
    meters.update('loss', torch.tensor(float(rank * 10 + n)))
    meters.update('time', 0.5 + rank)
s = meters.summary()
# rank 0: loss 0..3 (mean 1.5, last 3); rank 1: 10..13 (mean 11.5, last 13)
assert s['loss']['avg'] == 6.5 and s['loss']['latest'] == 8.0, s
assert s['time']['avg'] == 1.0, s
bad = MeterBuffer()
bad.update('loss' if rank == 0 else 'other', torch.tensor(1.0))  # same count, other names
try:
    bad.summary()
except RuntimeError as exc:
    assert 'differ across ranks' in str(exc)
else:
    raise AssertionError('mismatched keys not detected')
dist.destroy_process_group()
print('RANK_OK', rank)
'''


@pytest.mark.timeout(120)
def test_summary_averages_across_two_gloo_ranks(tmp_path):
    script = tmp_path / 'meters_dist.py'
    script.write_text(DIST_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get('PYTHONPATH', ''), OMP_NUM_THREADS='1')
    result = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2',
                             str(script)], capture_output=True, text=True, env=env, timeout=110)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count('RANK_OK') == 2
