"""The framework's per-iteration work, counted: Python calls into hookloop per training
iteration are a small constant (they do not grow with the run), under a budget, for the
default hooks, accumulation and TensorBoard logging. Host syncs are counted in
``test_sync_count.py``; time in ``bench/overhead.py``.

The counts do not depend on the machine's load: a tracker's records are handed over at flush
points only (the flush period, a wall-clock interval, is set past the run), and the garbage of
earlier tests is collected before each measured run, not during it (a finalizer of a hookloop
object would count as a call). ``test_the_count_does_not_depend_on_the_clock`` runs with a
clock that jumps seconds at every reading, the way a loaded machine looks to the run."""
import collections
import gc
import os
import sys
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookloop
from hookloop import Trainer

ROOT = os.path.dirname(os.path.abspath(hookloop.__file__))
# Calls per iteration allowed. The default hooks make about 7.5 (the data fetch and the
# sampler, the step and forward, the optimizer hook and its processor); before the hooks said
# when they work (Hook.next_call) it was 28. The budget leaves room for small changes, not for
# a default hook called at every iteration again.
BUDGET = 12

MODES = {
    'default': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1)),
    'accum2': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1),
                   optimizer_config=dict(cumulative_iters=2)),
    'tensorboard': dict(log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook'),
                                                            dict(type='TensorboardLoggerHook')])),
}


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def hookloop_calls(tmp_path, mode, iters):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4 * iters, 8, generator=generator), torch.randn(4 * iters, 1, generator=generator))
    torch.manual_seed(0)
    model = Loss()
    trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), max_epochs=1, seed=0,
                      train_dataloader=DataLoader(data, batch_size=4, shuffle=True), device='cpu',
                      work_dir=str(tmp_path / f'{mode}_{iters}'), log_level='WARNING', **MODES[mode])
    trainer.resolve_hooks()
    counts = collections.Counter()

    def profile(frame, event, arg):
        if event == 'call' and frame.f_code.co_filename.startswith(ROOT):
            counts[frame.f_code.co_name] += 1
    gc.collect()
    gc.disable()  # no other test's garbage collected (its finalizers run) inside the count
    sys.setprofile(profile)
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
        gc.enable()
        trainer.close()
    return counts


@pytest.fixture(autouse=True)
def no_timed_flush(flush_every):
    flush_every(1e9)  # records handed over at flush points only, however slow the machine


@pytest.fixture
def slow_clock(monkeypatch):
    """Every reading of the clocks advances them by 5 s: the run as a loaded machine sees it."""
    offset = [0.0]

    def slowed(clock):
        def read():
            offset[0] += 5.0
            return clock() + offset[0]
        return read
    for name in ('monotonic', 'perf_counter', 'time'):
        monkeypatch.setattr(time, name, slowed(getattr(time, name)))


@pytest.mark.parametrize('mode', list(MODES))
def test_calls_per_iteration_are_a_small_constant(tmp_path, mode):
    if mode == 'tensorboard':
        pytest.importorskip('tensorboard')
    # 100 more iterations each time; log events at every 50th in both differences
    runs = [hookloop_calls(tmp_path, mode, n) for n in (100, 200, 300)]
    per_iter = [(sum(b.values()) - sum(a.values())) / 100 for a, b in zip(runs, runs[1:])]
    print(f'{mode}: {per_iter[0]:.2f} hookloop calls per iteration')
    assert per_iter[0] == pytest.approx(per_iter[1], abs=0.05), per_iter  # constant, not growing with the run
    assert per_iter[0] <= BUDGET, collections.Counter({k: (runs[1][k] - runs[0][k]) / 100 for k in runs[1]})


@pytest.mark.parametrize('mode', list(MODES))
def test_the_count_does_not_depend_on_the_clock(tmp_path, mode, request):
    if mode == 'tensorboard':
        pytest.importorskip('tensorboard')
    hookloop_calls(tmp_path / 'warm', mode, 20)  # first-use caches (hook schedules, imports) filled
    fast = hookloop_calls(tmp_path / 'fast', mode, 100)
    request.getfixturevalue('slow_clock')
    slow = hookloop_calls(tmp_path / 'slow', mode, 100)
    assert slow == fast, {k: slow[k] - fast[k] for k in set(slow) | set(fast) if slow[k] != fast[k]}
