import os
import subprocess
import sys

import pytest
import torch

import hookloop.logging.meters as meters_module
from hookloop.logging.meters import MeterBuffer


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
    # the path of a device's tensors (CPU tensors are read where they are: see the next test)
    monkeypatch.setattr(meters_module, '_cpu_numbers', lambda values: None)
    monkeypatch.setattr(torch.Tensor, 'tolist', lambda self: calls.append(1) or original(self))
    monkeypatch.setattr(torch.Tensor, 'item', lambda self: pytest.fail('item() called'))
    first = meters.summary()
    assert meters.summary() is first  # same state: no second copy
    assert len(calls) == 1
    meters.update('loss', torch.tensor(0.0))
    meters.summary()
    assert len(calls) == 2


def _fill_every_kind(meters):
    generator = torch.Generator().manual_seed(3)
    for n in range(30):
        meters.update('loss', torch.randn((), generator=generator) * 1e3)
        meters.update('f64', torch.tensor(1 / 3 + n, dtype=torch.float64))  # float32 first, as on a device
        meters.update('i64', torch.tensor(16_777_217 + n))  # not exact in float32
        meters.update('bf16', torch.tensor(0.1 * n, dtype=torch.bfloat16))
        meters.update('f16', torch.tensor(0.3 * n, dtype=torch.float16))
        meters.update('mixed', torch.tensor([2.5 + n]) if n % 2 else torch.tensor(1.25 * n))  # [] and [1]
        meters.update('host', 0.1 * n)


def test_cpu_tensors_read_in_place_give_the_device_paths_numbers(monkeypatch):
    """CPU tensors are read one by one (a memory read; stacking them costs more on the host):
    the numbers, their order and the keys' order are exactly what the stack-and-copy path of a
    device gives."""
    fast, device_path = MeterBuffer(), MeterBuffer()
    _fill_every_kind(fast)
    _fill_every_kind(device_path)
    mark_fast, mark_device = fast.mark(), device_path.mark()
    for meters in (fast, device_path):
        meters.update('loss', torch.tensor(7.0))
    stacks = []
    original_stack = torch.stack
    monkeypatch.setattr(torch, 'stack', lambda *a, **k: stacks.append(1) or original_stack(*a, **k))
    got = [fast.summary(), fast.summary(mark_fast)]
    assert len(stacks) == 2  # only the float64 and int64 keys take the stack (float32 first, as on a device)
    monkeypatch.setattr(meters_module, '_cpu_numbers', lambda values: None)
    want = [device_path.summary(), device_path.summary(mark_device)]
    assert [list(g.items()) for g in got] == [list(w.items()) for w in want]
    assert got[1] == {'loss': {'avg': 7.0, 'latest': 7.0, 'count': 1}}


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
import hookloop.logging.meters as meters_module
from hookloop.logging.meters import MeterBuffer
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


def test_a_bulk_series_reads_as_if_each_value_had_been_updated():
    bulk, direct = MeterBuffer(history=8), MeterBuffer(history=8)
    series = bulk.bulk_series('loss')
    marks = []
    for n in range(30):
        value = torch.tensor(float(n), requires_grad=True) * 2
        series.append(value.detach())
        direct.update('loss', value)
        if n % 7 == 3:
            marks.append((bulk.mark(), direct.mark()))  # a read: the series hands its values over
    for bulk_mark, direct_mark in marks[-2:]:
        assert bulk.summary(bulk_mark) == direct.summary(direct_mark)
    assert bulk.summary() == direct.summary() and 'loss' in bulk and bulk.keys() == ['loss']


def test_a_bulk_series_follows_a_larger_history():
    meters = MeterBuffer(history=4)
    series = meters.bulk_series('loss')
    meters.reserve(20)  # a logger with interval 20
    for n in range(20):
        series.append(torch.tensor(float(n)))
    summary = meters.summary()['loss']
    assert summary['count'] == 20 and summary['avg'] == pytest.approx(9.5)


def test_sources_are_read_before_every_read_and_listeners_hear_each_new_summary():
    meters = MeterBuffer()
    pending, heard = [], []
    meters.add_source(lambda: [meters.extend('time', pending[:]), pending.clear()])
    meters.add_listener(heard.append)
    pending.extend([1.0, 3.0])
    first = meters.summary()
    assert first['time'] == {'avg': 2.0, 'latest': 3.0, 'count': 2} and heard == [first]
    assert meters.summary() is first and len(heard) == 1  # nothing new: the cached summary, no second call
    pending.append(5.0)
    assert meters.summary()['time']['count'] == 3 and len(heard) == 2
    meters.remove_listener(heard.append)
    pending.append(7.0)
    meters.summary()
    assert len(heard) == 2


def test_a_window_of_tensors_of_mixed_shapes_is_still_one_sync():
    meters = MeterBuffer()
    for value in (torch.tensor(1.0), torch.tensor([3.0])):
        meters.update('loss', value)
    assert meters.summary()['loss'] == {'avg': 2.0, 'latest': 3.0, 'count': 2}
