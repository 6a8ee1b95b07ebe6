"""Logging must not read tensors on the host every iteration: count the host reads."""
import collections
import os
import sys

import pytest
import torch

import hookloop.logging.meters as meters_module
from log_utils import make_trainer, run

HOST_READS = ('item', 'tolist', '__bool__', '__float__', '__int__', '__index__', 'numpy')


@pytest.fixture
def host_reads(monkeypatch):
    """Counts calls of the Tensor methods that copy a value to the host (a sync on GPU).

    The DataLoader's own draw of a worker base seed (one CPU ``item`` per epoch, from
    ``torch/utils/data``) is not the trainer's doing and is left out. The meters read CPU
    tensors in place, one by one (no copy: no sync); here they take the path a device's
    tensors take, so that what is counted is what a GPU would sync."""
    monkeypatch.setattr(meters_module, '_cpu_numbers', lambda values: None)
    counts = collections.Counter()
    data_dir = os.path.join('torch', 'utils', 'data')
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            if data_dir not in sys._getframe(1).f_code.co_filename:
                counts[_name] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def train_and_count(tmp_path, host_reads, max_epochs, hooks):
    trainer = make_trainer(tmp_path, hooks, interval=50, max_epochs=max_epochs, batch_size=1)  # 40 iters/epoch
    host_reads.clear()
    run(trainer)
    return sum(host_reads.values()), dict(host_reads)


@pytest.mark.parametrize('hooks', [[dict(type='TextLoggerHook', by_epoch=False)],
                                   [dict(type='TextLoggerHook', by_epoch=False),
                                    dict(type='TensorboardLoggerHook', by_epoch=False)]],
                         ids=['text', 'text+tensorboard'])
def test_host_reads_scale_with_log_events_not_iterations(tmp_path, host_reads, hooks):
    if len(hooks) > 1:
        pytest.importorskip('tensorboard', reason='tensorboard is not installed')
    # 120 iterations: log events at 50 and 100; 240 iterations: at 50, 100, 150, 200.
    short, short_detail = train_and_count(tmp_path / 'a', host_reads, 3, hooks)
    long, long_detail = train_and_count(tmp_path / 'b', host_reads, 6, hooks)
    # at most two reads per log event (one summary copy each), and the invalid-loss guard's one
    # look per epoch (a bad loss is acted on within one log interval across epoch ends)
    assert short <= 2 * 2 + 3, short_detail
    assert long - short <= 2 * 2 + 3, (short_detail, long_detail)  # 120 more iterations, 2 more log events


@pytest.mark.cuda
def test_cuda_syncs_scale_with_log_events(tmp_path):
    """On a GPU, torch reports every synchronising call in 'warn' sync-debug mode."""
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU')
    import warnings

    def syncs(max_epochs, work_dir):
        trainer = make_trainer(work_dir, [dict(type='TextLoggerHook', by_epoch=False)], interval=50,
                               max_epochs=max_epochs, batch_size=1, device='cuda')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                run(trainer)
        finally:
            torch.cuda.set_sync_debug_mode('default')
        return sum('synchroniz' in str(w.message) for w in caught)

    short, long = syncs(3, tmp_path / 'a'), syncs(6, tmp_path / 'b')
    assert long - short <= 2 * 2, (short, long)  # 120 more iterations bring 2 more log events
