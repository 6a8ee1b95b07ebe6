"""Asynchronous checkpoints (``checkpoint_config=dict(async_save=True)``): the files equal
synchronous saves, the staging copy is reused, one save is in flight at a time, failures are
reported, retention stays right, also across resumes."""
import errno
import os
import threading

import pytest
import torch
from torch.utils.data import DataLoader

import hookloop.checkpoint.atomic as atomic_module
import hookloop.checkpoint.format as ckpt_module
from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Hook, Trainer
from hookloop.checkpoint.async_writer import AsyncCheckpointWriter
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import CheckpointError
from resume_helpers import assert_states_equal


def make_trainer(work_dir, epochs=3, checkpoint=None, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8, shuffle=True)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=epochs, work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=checkpoint or dict(interval=1), **kwargs)


def flat(checkpoint):
    state = {f'model.{k}': v for k, v in checkpoint['state_dict'].items()}
    state.update({f'ema.{k}': v for k, v in checkpoint['ema_state_dict'].items()})
    for index, values in checkpoint['optimizer']['state'].items():
        state.update({f'optim.{index}.{k}': v for k, v in values.items()})
    state['rng'] = checkpoint['rng']['torch']
    return state


def test_async_saves_equal_sync_saves(tmp_path):
    ema = [dict(type='EMAHook', momentum=0.1, warm_up=1)]
    train(make_trainer(tmp_path / 'sync', checkpoint=dict(interval=2, by_epoch=False), custom_hooks=ema))
    train(make_trainer(tmp_path / 'async', checkpoint=dict(interval=2, by_epoch=False, async_save=True),
                       custom_hooks=ema))
    names = sorted(n for n in os.listdir(tmp_path / 'sync') if n.endswith('.pth'))
    assert names == sorted(n for n in os.listdir(tmp_path / 'async') if n.endswith('.pth'))
    assert len(names) == 8  # iterations 2, 4, ..., 14 and the last one, 15
    for name in names:
        sync, background = load_checkpoint(str(tmp_path / 'sync' / name)), load_checkpoint(str(tmp_path / 'async' / name))
        assert_states_equal(flat(sync), flat(background))
        assert sync['meta']['iter'] == background['meta']['iter']
        assert sync['hooks']['CheckpointHook']['saved'] == [
            p.replace(str(tmp_path / 'async'), str(tmp_path / 'sync')) for p in background['hooks']['CheckpointHook']['saved']]
    assert read_pointer(tmp_path / 'async') == str(tmp_path / 'async' / 'iter_15.pth')
    assert not [n for n in os.listdir(tmp_path / 'async') if n.endswith('.tmp')]


def test_staging_buffers_are_reused_between_saves():
    writer = AsyncCheckpointWriter()
    weights = {'w': torch.randn(64, 64), 'b': torch.randn(64)}
    first = writer.stage({'state_dict': weights, 'meta': {'iter': 1}})
    weights['w'].add_(1)
    second = writer.stage({'state_dict': weights, 'meta': {'iter': 2}})
    assert second['state_dict']['w'].data_ptr() == first['state_dict']['w'].data_ptr()
    assert torch.equal(second['state_dict']['w'], weights['w'])
    assert second['state_dict']['w'].data_ptr() != weights['w'].data_ptr()  # a copy, not the live tensor
    assert second['meta'] == {'iter': 2}
    shared = torch.ones(3)
    staged = writer.stage({'a': shared, 'b': [shared]})
    assert staged['a'] is staged['b'][0]  # shared storage stays shared (torch.save writes it once)


def test_one_save_in_flight_and_the_run_waits_for_the_last(tmp_path, monkeypatch):
    """Each write is held until the next save asks for it: a second write never starts
    while the first runs, and train() returns only when the last one is on disk."""
    active, overlaps, original = [], [], ckpt_module.save_checkpoint
    lock = threading.Lock()

    def slow_save(checkpoint, path):
        with lock:
            active.append(path)
            overlaps.append(len(active))
        threading.Event().wait(0.05)
        original(checkpoint, path)
        with lock:
            active.remove(path)
    monkeypatch.setattr(ckpt_module, 'save_checkpoint', slow_save)
    trainer = train(make_trainer(tmp_path, checkpoint=dict(interval=1, by_epoch=False, async_save=True)))
    assert overlaps and max(overlaps) == 1
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_15.pth')
    assert load_checkpoint(str(tmp_path / 'iter_15.pth'))['meta']['iter'] == 15
    assert_states_equal(load_checkpoint(str(tmp_path / 'iter_15.pth'))['state_dict'], trainer.model.state_dict())


def failing_disk(monkeypatch, fail_on):
    # write_temporary is the first step of every save (the checkpoint, its .sha256, the pointer)
    original, calls = atomic_module.write_temporary, []

    def write_temporary(path, write):
        calls.append(path)
        if os.path.basename(path) == fail_on:
            raise OSError(errno.ENOSPC, 'No space left on device')
        return original(path, write)
    monkeypatch.setattr(atomic_module, 'write_temporary', write_temporary)


def test_failed_background_write_is_raised_at_the_next_save(tmp_path, monkeypatch):
    failing_disk(monkeypatch, 'iter_2.pth')
    trainer = make_trainer(tmp_path, checkpoint=dict(interval=2, by_epoch=False, async_save=True))
    with pytest.raises(CheckpointError, match='background checkpoint save failed.*iter_2.pth.*No space left'):
        train(trainer)
    assert trainer.iter == 3  # raised by the save after iteration 4, before it wrote anything
    assert not os.path.exists(tmp_path / 'iter_4.pth') and read_pointer(tmp_path) is None


def test_failed_last_background_write_fails_the_run_at_the_end(tmp_path, monkeypatch):
    failing_disk(monkeypatch, 'iter_15.pth')
    closed = []

    class SeesTheEnd(Hook):
        def after_run(self, trainer):
            closed.append(trainer.exception)
    trainer = make_trainer(tmp_path, checkpoint=dict(interval=5, by_epoch=False, async_save=True),
                           custom_hooks=[SeesTheEnd()])
    with pytest.raises(CheckpointError, match='iter_15.pth'):
        train(trainer)
    assert len(closed) == 1 and isinstance(closed[0], CheckpointError)  # after_run hooks still ran
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_10.pth')


@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_retention_counts_the_checkpoint_a_run_resumed_from(tmp_path, async_save):
    """max_keep_ckpts=2 over a run stopped after 6 iterations and resumed to 15: only the
    two newest remain (before, the checkpoint resumed from was never deleted)."""
    checkpoint = dict(interval=1, by_epoch=False, max_keep_ckpts=2, async_save=async_save)

    class StopAt6(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter + 1 == 6:
                trainer.request_stop('test')
    train(make_trainer(tmp_path, checkpoint=checkpoint, custom_hooks=[StopAt6()]))
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['iter_5.pth', 'iter_6.pth']
    train(make_trainer(tmp_path, checkpoint=checkpoint, resume_from='auto'))
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['iter_14.pth', 'iter_15.pth']
