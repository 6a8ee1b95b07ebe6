"""A hook's output directory stays under the work dir unless the user names an absolute path,
which is then logged and locked like the work dir; ``..`` (or a symlink) never leaves it."""
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.errors import ConfigError
from hookloop.fileio.work_dir_lock import LOCK_NAME


def make_trainer(work_dir, checkpoint=None, hooks=()):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(32), batch_size=8)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_iters=4,
                   work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=2),
                   checkpoint_config=checkpoint or dict(interval=2, by_epoch=False), custom_hooks=list(hooks))


class Exporter(Hook):
    """Writes ``done.txt`` into ``out_dir`` (relative to the work dir, or absolute) at the end."""

    def __init__(self, out_dir):
        self.out_dir = out_dir

    def output_dirs(self, trainer):
        return {'export': os.path.join(trainer.work_dir, self.out_dir)}

    def after_run(self, trainer):
        path = os.path.join(trainer.work_dir, self.out_dir)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, 'done.txt'), 'w') as f:
            f.write('x')


def train(trainer):
    try:
        trainer.train()
    finally:
        trainer.close()


@pytest.mark.parametrize('how', ['checkpoint ../', 'hook ../', 'hook ../../', 'symlink'])
def test_a_relative_output_dir_never_leaves_the_work_dir(tmp_path, how):
    work = tmp_path / 'runs' / 'work'
    if how == 'symlink':
        work.mkdir(parents=True)
        (tmp_path / 'outside').mkdir()
        os.symlink(tmp_path / 'outside', work / 'link')
    checkpoint = dict(interval=2, by_epoch=False, out_dir='../stolen') if how == 'checkpoint ../' else None
    hooks = {'hook ../': [Exporter('../stolen')], 'hook ../../': [Exporter('x/../../../stolen')],
             'symlink': [Exporter('link/stolen')]}.get(how, [])
    with pytest.raises(ConfigError, match=r'leaves the work dir .* give an absolute path') as refused:
        train(make_trainer(str(work), checkpoint, hooks))
    assert '\n' not in str(refused.value)
    assert not (tmp_path / 'runs' / 'stolen').exists() and not (tmp_path / 'stolen').exists()
    assert not (tmp_path / 'outside' / 'stolen').exists()


def test_an_absolute_output_dir_is_logged_and_locked_like_the_work_dir(tmp_path):
    elsewhere = tmp_path / 'exports'
    checkpoints = tmp_path / 'ckpts'

    class SecondRun(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter == 0:  # another run, its own work dir, the same absolute checkpoint dir
                with pytest.raises(ConfigError, match='is in use by another run'):
                    train(make_trainer(str(tmp_path / 'other'), dict(interval=2, by_epoch=False,
                                                                     out_dir=str(checkpoints))))

    trainer = make_trainer(str(tmp_path / 'work'), dict(interval=2, by_epoch=False, out_dir=str(checkpoints)),
                           [Exporter(str(elsewhere)), SecondRun()])
    train(trainer)
    assert (elsewhere / 'done.txt').exists() and (checkpoints / 'iter_4.pth').exists()
    assert (checkpoints / LOCK_NAME).exists() and (elsewhere / LOCK_NAME).exists()
    log = next((tmp_path / 'work').glob('*.log')).read_text()
    assert f'writes its checkpoint outside the work dir, to {checkpoints}' in log
    assert f'writes its export outside the work dir, to {elsewhere}' in log
    assert not (tmp_path / 'other').exists() or not any(n.endswith('.pth') for n in os.listdir(tmp_path / 'other'))
    train(make_trainer(str(tmp_path / 'again'), dict(interval=2, by_epoch=False, out_dir=str(checkpoints))))


def test_an_output_lock_taken_away_stops_the_run(tmp_path):
    elsewhere = tmp_path / 'exports'

    class Steal(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter == 0:
                os.remove(elsewhere / LOCK_NAME)

    with pytest.raises(ConfigError, match='was deleted while this run held it'):
        train(make_trainer(str(tmp_path / 'work'), hooks=[Exporter(str(elsewhere)), Steal()]))
