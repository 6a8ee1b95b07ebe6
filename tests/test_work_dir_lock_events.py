"""A run whose work dir lock is taken away stops at its next log event, writing nothing more there;
the run that took the dir over keeps its files."""
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.format import read_pointer
from hookloop.errors import ConfigError
from hookloop.fileio.work_dir_lock import LOCK_NAME


def make_trainer(work_dir, hooks=(), max_iters=12, log_interval=3, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(64), batch_size=4)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_iters=max_iters,
                   work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=log_interval),
                   checkpoint_config=dict(interval=max_iters, by_epoch=False), custom_hooks=list(hooks), **kwargs)


class TakeOver(Hook):
    """At iteration ``at``: delete the lock file and run a second trainer on the same dir to its end."""

    def __init__(self, at):
        self.at, self.second = at, None

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            os.remove(os.path.join(trainer.work_dir, LOCK_NAME))
            self.second = make_trainer(trainer.work_dir, max_iters=4)
            try:
                self.second.train()
            finally:
                self.second.close()


@pytest.mark.parametrize('interval', [None, 1])
def test_a_run_whose_lock_was_taken_stops_at_its_next_log_event(tmp_path, interval):
    """Before: the first run trained to its end and lost everything at its only checkpoint."""
    hooks = [TakeOver(at=4)] + ([dict(type='WorkDirLockHook', interval=interval)] if interval else [])
    first = make_trainer(tmp_path / 'work', hooks)
    with pytest.raises(ConfigError, match='was (deleted|replaced) while this run held it') as stopped:
        first.train()
    first.close()
    assert '\n' not in str(stopped.value)
    limit = 4 + (interval or 3)  # default: log_config's interval (3)
    assert first.iter <= limit, first.iter  # stopped within one interval of the take-over
    takeover = first.hooks[[type(h).__name__ for h in first.hooks].index('TakeOver')]
    assert takeover.second.outcome.finished
    files = sorted(name for name in os.listdir(tmp_path / 'work') if name.endswith('.pth'))
    assert files == ['iter_4.pth']  # the second run's, untouched; the first wrote none
    assert read_pointer(str(tmp_path / 'work')).endswith('iter_4.pth')


def test_the_check_is_a_default_hook_on_rank_0_only(tmp_path):
    trainer = make_trainer(tmp_path / 'work')
    trainer.train()
    trainer.close()
    assert 'WorkDirLockHook' in trainer.hook_order_table()
