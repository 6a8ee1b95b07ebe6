"""Safety nets that never keep a bad state or drop a good one (issue 21): a checkpoint is
never written with a non-finite state, whatever invalid-loss hook is registered; async saves
change retention and the best file only once the new file is on disk, and stage a deep copy."""
import errno
import math
import os
import threading

import pytest
import torch
from torch.utils.data import DataLoader

import hookloop.checkpoint.atomic as atomic_module
import hookloop.checkpoint.format as ckpt_module
from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.async_writer import AsyncCheckpointWriter
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import CheckpointError, InvalidLossError
from hookloop.checkpoint.finite_state import check_finite_state, is_finite, non_finite_entries


class Faulty(Regressor):
    """A regressor with, at forward number ``at`` (0-based), a NaN loss (``'loss'``) or a
    finite loss whose gradients are NaN (``'grad'``: ``sqrt`` at 0 times the weights)."""

    def __init__(self, at, kind):
        super().__init__()
        self.at, self.kind, self.calls = at, kind, 0

    def forward(self, x, y=None):
        loss = super().forward(x, y)
        if y is None:
            return loss
        self.calls += 1
        if self.calls - 1 == self.at:
            if self.kind == 'loss':
                return loss * float('nan')
            return loss + torch.sqrt(self.net[0].weight.sum() * 0.0)  # loss finite, its gradient NaN
        return loss


def make_trainer(work_dir, model, epochs=3, **kwargs):
    torch.manual_seed(0)
    kwargs.setdefault('log_config', dict(interval=100))
    return Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=DataLoader(regression_data(), 8), max_epochs=epochs, work_dir=work_dir,
                   seed=0, device='cpu', **kwargs)


def checkpoint_files(work_dir):
    return sorted(n for n in os.listdir(work_dir) if n.endswith('.pth'))


def assert_every_file_finite(work_dir):
    for name in checkpoint_files(work_dir):
        checkpoint = load_checkpoint(str(work_dir / name))
        assert non_finite_entries(checkpoint) == [], name


@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_nan_gradients_with_a_finite_loss_never_become_last_nor_delete_the_good_file(tmp_path, async_save):
    # Item 1: NaN gradients at iteration 10, a save iteration, with a finite loss: its save is refused.
    trainer = make_trainer(tmp_path, Faulty(9, 'grad'), checkpoint_config=dict(
        interval=5, by_epoch=False, max_keep_ckpts=1, async_save=async_save))
    with pytest.raises(InvalidLossError, match=r'iter_10\.pth.*not finite after 10 iterations.*model weight '
                                               r'net\.0\.weight'):
        trainer.train()
    trainer.close()
    assert checkpoint_files(tmp_path) == ['iter_5.pth']
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_5.pth')
    assert_every_file_finite(tmp_path)


def test_mmcv_check_invalid_loss_hook_does_not_remove_the_protection(tmp_path):
    # Item 5: CheckInvalidLossHook(interval=50) replaces the default guard; a NaN loss at
    # iteration 7 reaches the weights, yet no NaN checkpoint is written nor becomes last.
    trainer = make_trainer(tmp_path, Faulty(6, 'loss'), checkpoint_config=dict(interval=5, by_epoch=False),
                           custom_hooks=[dict(type='CheckInvalidLossHook', interval=50)])
    with pytest.raises(InvalidLossError, match='not saving .*iter_10.pth'):
        trainer.train()
    trainer.close()
    assert 'FiniteLossGuard' not in trainer.hook_order_table()
    assert checkpoint_files(tmp_path) == ['iter_5.pth']
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_5.pth')


def test_the_check_covers_optimizer_ema_and_scaler_state():
    good = {'state_dict': {'w': torch.ones(3)}, 'optimizer': {'state': {0: {'momentum_buffer': torch.ones(3)}}},
            'ema_state_dict': {'w': torch.ones(3)}, 'hooks': {'OptimizerHook': {'scaler': {'scale': 1024.0}}},
            'meta': {'iter': 4}, 'rng': {'x': float('nan')}}  # meta/rng are not training state
    assert is_finite(good)
    check_finite_state(good, 'x.pth')
    for where, key in [('optimizer', 'optimizer state state.0.momentum_buffer'), ('ema_state_dict', 'EMA average w'),
                       ('hooks', 'hook state OptimizerHook.scaler.scale')]:
        bad = {k: (v if not isinstance(v, dict) else dict(v)) for k, v in good.items()}
        if where == 'optimizer':
            bad['optimizer'] = {'state': {0: {'momentum_buffer': torch.tensor([1.0, float('inf'), 1.0])}}}
        elif where == 'ema_state_dict':
            bad['ema_state_dict'] = {'w': torch.tensor([float('nan')] * 3, dtype=torch.float16)}
        else:
            bad['hooks'] = {'OptimizerHook': {'scaler': {'scale': float('inf')}}}
        assert not is_finite(bad)
        with pytest.raises(InvalidLossError, match=key.replace('.', r'\.')):
            check_finite_state(bad, 'x.pth')


def test_large_finite_half_values_are_finite():
    # the check takes the largest magnitude, never a 2-norm that would overflow fp16
    assert is_finite({'state_dict': {'w': torch.full((1000,), 60000.0, dtype=torch.float16)}})


def scripted_metric(name, values):
    values = iter(values)
    return lambda outputs, batch: {name: next(values)}


def test_async_best_keeps_the_previous_best_when_the_new_one_fails_to_write(tmp_path, monkeypatch):
    # Item 6: the previous best went before the new one was on disk; its write fails (ENOSPC).
    original = atomic_module.write_temporary

    def write_temporary(path, write):
        if os.path.basename(path) == 'best_acc_epoch_2.pth':
            raise OSError(errno.ENOSPC, 'No space left on device')
        return original(path, write)
    monkeypatch.setattr(atomic_module, 'write_temporary', write_temporary)
    trainer = make_trainer(tmp_path, Regressor(), checkpoint_config=dict(interval=1, save_best='acc',
                                                                         async_save=True),
                           val_dataloader=DataLoader(regression_data(8), batch_size=8),
                           val_evaluator=scripted_metric('acc', [0.5, 0.75, 0.8]), evaluation=dict(interval=1))
    with pytest.raises(CheckpointError, match='background checkpoint save failed.*best_acc_epoch_2.pth'):
        trainer.train()
    trainer.close()
    assert 'best_acc_epoch_1.pth' in checkpoint_files(tmp_path)
    assert read_pointer(tmp_path) == str(tmp_path / 'epoch_1.pth')


def test_async_best_replaces_the_previous_best_once_on_disk(tmp_path):
    trainer = make_trainer(tmp_path, Regressor(), checkpoint_config=dict(interval=1, save_best='acc',
                                                                         max_keep_ckpts=1, async_save=True),
                           val_dataloader=DataLoader(regression_data(8), batch_size=8),
                           val_evaluator=scripted_metric('acc', [0.5, 0.75, 0.6]), evaluation=dict(interval=1))
    trainer.train()
    trainer.close()
    assert checkpoint_files(tmp_path) == ['best_acc_epoch_2.pth', 'epoch_3.pth']


def test_staging_is_a_deep_snapshot_of_containers_and_objects():
    writer = AsyncCheckpointWriter()
    seen, extra = {1, 2}, {'nested': [{'a'}]}
    staged = writer.stage({'hooks': {'h': {'seen': seen, 'extra': extra, 'w': torch.ones(2)}}})
    seen.add(3)
    extra['nested'][0].add('b')
    assert staged['hooks']['h']['seen'] == {1, 2}
    assert staged['hooks']['h']['extra'] == {'nested': [{'a'}]}


class Remembers(Hook):
    PRIORITY = 'HIGHEST'  # before the checkpoint hook: the save of iteration 3 holds {1, 2, 3}
    """A hook whose state is a set of the iterations it has seen; it lets the background
    write of iteration 3 go on only once iteration 5 has changed the set."""

    def __init__(self, release):
        self.seen, self.release = set(), release

    def after_train_iter(self, trainer):
        self.seen.add(trainer.iter + 1)
        if trainer.iter + 1 == 5:
            self.release.set()

    def state_dict(self):
        return {'seen': self.seen}

    def load_state_dict(self, state):
        self.seen = set(state['seen'])


def test_async_checkpoint_holds_the_hook_state_of_its_save_point(tmp_path, monkeypatch):
    # Item 7: a set in a hook's state was written as the writer found it later.
    release, original = threading.Event(), ckpt_module.save_checkpoint

    def held_save(checkpoint, path):
        if path.endswith('iter_3.pth'):
            assert release.wait(30)
        original(checkpoint, path)
    monkeypatch.setattr(ckpt_module, 'save_checkpoint', held_save)
    trainer = make_trainer(tmp_path, Regressor(), epochs=2, custom_hooks=[Remembers(release)],
                           checkpoint_config=dict(interval=3, by_epoch=False, async_save=True))
    trainer.train()
    trainer.close()
    assert release.is_set()
    saved = load_checkpoint(str(tmp_path / 'iter_3.pth'))['hooks']['Remembers']['seen']
    assert saved == {1, 2, 3}


# -- fp16: the guard knows about loss scaling (item 3) --------------------------------------------
def burst_data(bad_batches, batch_size=8):
    """regression_data with the inputs of ``bad_batches`` (0-based, per epoch) at 1e30: an
    inf loss under fp16 autocast."""
    x, y = regression_data().tensors
    x = x.clone()
    for batch in bad_batches:
        x[batch * batch_size:(batch + 1) * batch_size, 0] = 1e30
    return torch.utils.data.TensorDataset(x, y)


class LinearRegressor(torch.nn.Module):
    """One linear layer: an input of 1e30 gives an inf prediction under fp16, so an inf loss."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y=None):
        prediction = self.linear(x)
        return prediction if y is None else torch.nn.functional.mse_loss(prediction.float(), y)


def plain_amp(model, data, epochs):
    """The PyTorch AMP recipe: autocast + GradScaler, every batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler('cpu')
    for _ in range(epochs):
        for x, y in DataLoader(data, 8):
            with torch.autocast('cpu', dtype=torch.float16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    return scaler


@pytest.mark.parametrize('log_interval', [4, 5])
def test_fp16_overflow_burst_trains_like_a_plain_amp_loop(tmp_path, log_interval):
    data = burst_data([1, 2, 3])  # three overflowing batches per epoch: inf losses, skipped steps
    torch.manual_seed(0)
    model, reference = LinearRegressor(), LinearRegressor()
    reference.load_state_dict(model.state_dict())
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=DataLoader(data, 8),
                      max_epochs=3, work_dir=tmp_path, seed=0, device='cpu', log_config=dict(interval=log_interval),
                      optimizer_config=dict(precision='fp16'),
                      checkpoint_config=dict(interval=5, by_epoch=False))
    trainer.train()
    trainer.close()
    scaler = plain_amp(reference, data, 3)
    assert scaler.get_scale() < 65536.0  # the burst made the scaler back off: the test proves something
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_15.pth')
    assert_every_file_finite(tmp_path)


def test_fp16_dead_run_stops_within_one_log_interval(tmp_path):
    data = burst_data(range(5))  # every batch overflows: every step skipped
    trainer = Trainer(LinearRegressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(data, 8),
                      max_epochs=4, work_dir=tmp_path, seed=0, device='cpu', log_config=dict(interval=3),
                      optimizer_config=dict(precision='fp16'),
                      custom_hooks=[dict(type='FiniteLossGuard', max_skipped_steps=5)])
    # log events (by epoch, 5 iterations each) at iterations 3, 8, 13...; the guard also looks at
    # each epoch's end: the 5th skip (iteration 5) is seen there, before epoch 2 takes a step
    with pytest.raises(InvalidLossError, match=r'5 optimizer steps in a row skipped .* seen at the end of an '
                                               r'epoch by iteration 5 of 20'):
        trainer.train()
    trainer.close()
    assert trainer.iter == 5


def test_fp16_scale_floor_stops_the_run(tmp_path):
    data = burst_data(range(5))
    trainer = Trainer(LinearRegressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(data, 8),
                      max_epochs=4, work_dir=tmp_path, seed=0, device='cpu', log_config=dict(interval=2),
                      optimizer_config=dict(precision='fp16', loss_scale=dict(init_scale=8.)),
                      custom_hooks=[dict(type='FiniteLossGuard', min_loss_scale=1.0)])
    with pytest.raises(InvalidLossError, match=r'loss scale 0.5 below min_loss_scale=1 .* by iteration 4 of 20'):
        trainer.train()
    trainer.close()


def test_the_burst_gives_an_inf_loss_under_fp16_autocast():
    # what the fp16 tests above rest on: the loss itself is inf, not only the gradients
    data = burst_data([1])
    with torch.autocast('cpu', dtype=torch.float16):
        loss = LinearRegressor()(data.tensors[0][8:16], data.tensors[1][8:16])
    assert loss.item() == math.inf


# -- rollback restores what the step touched (item 4) ----------------------------------------------
@pytest.mark.parametrize('interval', [1, 3])
def test_rollback_restores_the_ema_averages_too(tmp_path, interval):
    # NaN gradients (finite loss) at iteration 7 reach the weights and the EMA; the NaN loss
    # of iteration 8 rolls back. The EMA must be rolled back with the model: every later
    # checkpoint holds finite EMA averages (before: NaN in all of them).
    trainer = make_trainer(tmp_path, Faulty(6, 'grad'), checkpoint_config=dict(interval=5, by_epoch=False),
                           custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='rollback', interval=interval),
                                         dict(type='EMAHook', momentum=0.5, warm_up=1)])
    trainer.train()
    trainer.close()
    assert checkpoint_files(tmp_path) == ['iter_10.pth', 'iter_15.pth', 'iter_5.pth']
    assert_every_file_finite(tmp_path)
    ema = next(h for h in trainer.hooks if type(h).__name__ == 'EMAHook')
    assert all(torch.isfinite(t).all() for t in ema.averages.values())


def test_rollback_restores_the_grad_scaler(tmp_path):
    # fp16: after the rollback the scaler's state (its growth tracker counts good steps) is
    # the snapshot's: snapshots before iterations 1, 3, 5; the NaN of iteration 5 rolls back
    # to the one before iteration 3 (the one before 5 never saw a finite loss).
    trainer = make_trainer(tmp_path, Faulty(4, 'loss'), epochs=2,
                           optimizer_config=dict(precision='fp16', loss_scale=dict(init_scale=1.0, growth_interval=1000)),
                           custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='rollback', interval=2)])
    trackers = []

    class Watch(Hook):
        def before_train_iter(self, trainer):
            optimizer_hook = next(h for h in trainer.hooks if h.name == 'OptimizerHook')
            trackers.append(optimizer_hook.state_dict()['scaler']['_growth_tracker'])
    trainer.register_hook(Watch())
    trainer.train()
    trainer.close()
    assert trackers[:5] == [0, 1, 2, 3, 4]
    assert trackers[5] == 2  # rolled back (before: 4, the skipped step leaves the scaler alone)


# -- the timer counts every second of training, saves included (item 8) ----------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_timer_counts_checkpoint_saves_at_an_epochs_last_iteration(tmp_path, monkeypatch, async_save):
    from hookloop.hooks.timer import IterTimerHook
    clock = FakeClock()

    class Ticks(Hook):
        PRIORITY = 'HIGHEST'

        def after_train_iter(self, trainer):
            clock.now += 1.0  # every iteration: 1 s
    trainer = make_trainer(tmp_path, Regressor(), epochs=None, max_iters=14, log_config=dict(interval=3),
                           custom_hooks=[IterTimerHook(clock=clock), Ticks()],
                           checkpoint_config=dict(interval=5, by_epoch=False, save_last=False, async_save=async_save))
    original = trainer.write_checkpoint

    def slow_write(*args, **kwargs):
        clock.now += 10.0  # every save (iterations 5 and 10, each an epoch's last): 10 s
        return original(*args, **kwargs)
    monkeypatch.setattr(trainer, 'write_checkpoint', slow_write)
    trainer.train()
    trainer.close()
    assert checkpoint_files(tmp_path) == ['iter_10.pth', 'iter_5.pth']
    times = list(trainer.meters._values['time'])
    assert len(times) == 14
    assert sum(times) == pytest.approx(14 * 1.0 + 2 * 10.0)  # before: 14, the saves dropped out


def test_huge_finite_values_are_finite():
    # the fused 2-norm overflows float32 here; the elements are finite, so the state is
    assert is_finite({'state_dict': {'w': torch.full((4,), 1e30)}, 'optimizer': {'x': torch.ones(2)}})
    assert not is_finite({'state_dict': {'w': torch.tensor([1e30, float('nan')])}})
