"""No silent NaN: with the default hooks a non-finite loss stops the run with a clear error,
and the last checkpoint written before it stays the latest."""
import math

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import InvalidLossError
from hookloop.hooks.finite_loss import non_finite_losses


class NaNAt(Regressor):
    """A regressor whose loss is NaN at forward number ``at`` (0-based)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x, y=None):
        loss = super().forward(x, y)
        self.calls += 1
        return loss * float('nan') if self.calls - 1 == self.at else loss


def make_trainer(work_dir, model, **kwargs):
    torch.manual_seed(0)
    return Trainer(model, optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(regression_data(), 8),
                   max_epochs=3, work_dir=work_dir, seed=0, device='cpu', **kwargs)


@pytest.mark.parametrize('checkpoint', [dict(interval=1, by_epoch=False), dict(interval=1)])
def test_nan_at_iteration_5_with_default_hooks_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path,
                                                                                                 checkpoint):
    trainer = make_trainer(tmp_path, NaNAt(5), checkpoint_config=checkpoint, log_config=dict(interval=3))
    # Iteration checkpoints: caught before iter_6.pth is written. Epoch checkpoints: caught at
    # the next log event (the 3rd iteration of epoch 2, index 7), before the 9th step.
    by_iter = not checkpoint.get('by_epoch', True)
    stopped, reported = (5, 6) if by_iter else (8, 8)  # reported: iterations whose loss was seen
    with pytest.raises(InvalidLossError, match=rf'non-finite loss \(loss=nan\) .* by iteration {reported} '):
        trainer.train()
    trainer.close()
    assert trainer.iter == stopped
    latest = read_pointer(tmp_path)
    assert latest == str(tmp_path / ('iter_5.pth' if not checkpoint.get('by_epoch', True) else 'epoch_1.pth'))
    weights = load_checkpoint(latest)['state_dict']
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_nan_between_log_events_without_checkpoints_is_caught_at_the_next_log(tmp_path):
    trainer = make_trainer(tmp_path, NaNAt(5), log_config=dict(interval=4))
    with pytest.raises(InvalidLossError, match='loss=nan'):
        trainer.train()
    trainer.close()
    # Logged at the 4th iteration of epoch 2 (index 8), refused before the step of index 9.
    assert trainer.iter == 9


def test_nan_in_the_last_iterations_is_not_silent(tmp_path):
    trainer = make_trainer(tmp_path, NaNAt(14), log_config=dict(interval=100))
    with pytest.raises(InvalidLossError, match='by iteration 15'):
        trainer.train()
    trainer.close()


def test_check_invalid_loss_hook_replaces_the_guard(tmp_path):
    trainer = make_trainer(tmp_path, NaNAt(5), log_config=dict(interval=3),
                           custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='skip')])
    trainer.train()
    trainer.close()
    assert 'FiniteLossGuard' not in trainer.hook_order_table()
    assert trainer.iter == 15


def test_non_finite_losses_reads_only_loss_keys():
    summary = {'loss': {'avg': math.inf, 'latest': 1.0}, 'time': {'avg': math.nan, 'latest': math.nan},
               'loss_aux': {'avg': 1.0, 'latest': 2.0}}
    assert non_finite_losses(summary) == {'loss': math.inf}


def test_nan_when_the_log_interval_divides_the_epoch_is_caught_at_the_epochs_last_log_event(tmp_path):
    """The log event is the epoch's last iteration: the guard's wake must survive the next
    epoch's planning (it was dropped, and the NaN was acted on only at the run's end)."""
    torch.manual_seed(0)
    trainer = Trainer(NaNAt(2), optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(regression_data(80), 8),
                      max_epochs=5, work_dir=tmp_path, seed=0, device='cpu', log_config=dict(interval=10))
    with pytest.raises(InvalidLossError, match='loss=nan'):
        trainer.train()
    trainer.close()
    # Logged at iteration index 9 (the epoch's last); refused before the next step.
    assert trainer.iter == 10
