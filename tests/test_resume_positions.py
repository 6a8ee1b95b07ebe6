"""Forged resume positions (issue 40 item 4): a checkpoint whose meta was edited and re-sealed
(fresh checksum) is refused in one line naming the checkpoint and the field, before anything
trains; before, ``samples_in_epoch=10**9``, ``inner_iter=99``, ``iter=-5`` and ``epoch=-2`` all
trained something else with rc 0, negative or fractional values were blamed on the dataset and
``'80'`` ended in a traceback."""
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import regression_data, train_and_close
from resume_helpers import StopAt
from test_elastic_resume import make
from hookloop import Trainer
from hookloop.checkpoint.format import load_checkpoint, save_checkpoint
from hookloop.errors import CheckpointError


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """A mid-epoch checkpoint: batch 4 over 40 samples, stopped after iteration 12 (epoch 2, 3 batches)."""
    work_dir = tmp_path_factory.mktemp('source')
    train_and_close(make(work_dir, 4, hooks=[StopAt(12)]))
    return load_checkpoint(str(work_dir / 'iter_13.pth'))


def forge(tmp_path, checkpoint, **meta):
    forged = dict(checkpoint, meta={**checkpoint['meta'], **meta})
    path = str(tmp_path / 'forged.pth')
    save_checkpoint(forged, path)  # an attacker re-seals: the checksum matches the edited bytes
    return path


@pytest.mark.parametrize('field, value', [
    ('samples_in_epoch', 10 ** 9), ('samples_in_epoch', -1), ('samples_in_epoch', 2.5), ('samples_in_epoch', '80'),
    ('inner_iter', 99), ('inner_iter', -1), ('inner_iter', 1.5), ('inner_iter', '3'),
    ('iter', -5), ('iter', 10 ** 6), ('iter', 2), ('epoch', -2), ('epoch', 7), ('epoch', 1.0),
    ('batch_size', 0), ('world_size', '1'), ('iters_per_epoch', -10), ('epoch_samples', None.__class__),
    ('max_iters', 0)])
def test_a_forged_position_is_refused_in_one_line_naming_the_field(tmp_path, saved, field, value):
    value = 'a class' if value is type(None) else value
    path = forge(tmp_path, saved, **{field: value})
    trainer = make(tmp_path / 'run', 4, resume_from=path)
    with pytest.raises(CheckpointError) as info:
        train_and_close(trainer)
    message = str(info.value)
    assert '\n' not in message and path in message and f"meta[{field!r}]" in message, message
    assert not list((tmp_path / 'run').glob('*.pth'))  # nothing trained, nothing written


def test_the_checkpoint_as_saved_resumes(tmp_path, saved):
    path = forge(tmp_path, saved)
    resumed = train_and_close(make(tmp_path / 'run', 4, resume_from=path))
    assert resumed.iter == 30


def test_a_stream_position_out_of_range_is_refused(tmp_path):
    """A continuous stream's position ('pass', 'batches_in_pass') is checked the same way."""
    def stream_trainer(work_dir, **kwargs):
        torch.manual_seed(0)
        loader = DataLoader(regression_data(), batch_size=4)
        return Trainer(torch.nn.Linear(4, 1), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader,
                       loss_fn=lambda out, batch: torch.nn.functional.mse_loss(out, batch[1]),
                       max_iters=12, iters_per_epoch=4, work_dir=str(work_dir), seed=0, device='cpu',
                       log_level='WARNING', checkpoint_config=dict(interval=5, by_epoch=False), **kwargs)

    def model_forward(trainer):
        trainer.wrapped_model = _TakesFirst(trainer.model)
        return trainer

    train_and_close(model_forward(stream_trainer(tmp_path / 'a')))
    checkpoint = load_checkpoint(str(tmp_path / 'a' / 'iter_5.pth'))
    for state, field in (({**checkpoint['data'], 'batches_in_pass': -3}, 'batches_in_pass'),
                         ({**checkpoint['data'], 'pass': '1'}, 'pass')):
        path = str(tmp_path / f'{field}.pth')
        save_checkpoint(dict(checkpoint, data=state), path)
        with pytest.raises(CheckpointError, match=rf"data\[{field!r}\]") as info:
            train_and_close(model_forward(stream_trainer(tmp_path / field, resume_from=path)))
        assert '\n' not in str(info.value) and path in str(info.value)


class _TakesFirst(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x, y):
        return self.module(x)
