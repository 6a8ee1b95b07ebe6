"""MMCV 1.7's EvalHook (issue 39 item 9): what MMCV's test_eval_hook.py checks, except its
``test_fn`` and Petrel ``out_dir`` parts: ``start`` validation and schedule (a resumed run
included), the warning for an empty result, the best checkpoint recorded in ``runner.meta``
(which the hook makes) and in the best file itself, and ``runner.resume`` restoring it."""
import os
import tempfile
from collections import OrderedDict
from unittest.mock import MagicMock

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookloop.compat.mmcv import EpochBasedRunner, EvalHook, IterBasedRunner, get_logger
from hookloop.checkpoint.format import load_checkpoint


class Scores(Dataset):
    """One sample; ``evaluate`` returns the next of a fixed series of scores."""

    def __init__(self, scores=(1, 4, 3, 7, 2, -3, 4, 6)):
        self.scores, self.calls = list(scores), 0

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return dict(x=torch.tensor([1.]))

    def evaluate(self, results, logger=None):
        if not self.scores:
            return {}
        score = self.scores[self.calls]
        self.calls += 1
        return OrderedDict(acc=score, loss_top=score)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.param = nn.Parameter(torch.tensor([1.]))

    def forward(self, x, **kwargs):
        return self.param * x

    def train_step(self, data, optimizer, **kwargs):
        return dict(loss=self(data['x']).sum())


def runner_of(kind, work_dir):
    return kind(model=Model(), work_dir=work_dir, logger=get_logger('eval-test'))


def test_start_is_checked_like_mmcv():
    loader = DataLoader(Scores())
    with pytest.raises(TypeError):
        EvalHook(MagicMock())
    with pytest.raises(ValueError):
        EvalHook(loader, interval=-1)
    with pytest.raises(ValueError):  # MMCV 1.7 refuses a negative start (older versions warned)
        EvalHook(loader, start=-1)


@pytest.mark.parametrize('kind', [EpochBasedRunner, IterBasedRunner])
@pytest.mark.parametrize('start, interval, begin, length, expected', [
    (None, 1, 0, 2, 2), (1, 1, 0, 2, 2), (None, 2, 0, 2, 1), (1, 2, 0, 3, 2),
    (0, 1, 0, 2, 3),  # start=0: also before the first epoch (iteration)
    (1, 1, 2, 3, 2),  # a run continued at 2, start <= 2: before it, and after the one left
    (2, 1, 1, 3, 2)])  # continued at 1, start 2: after each of the two left
def test_start_schedule(tmp_path, kind, start, interval, begin, length, expected):
    loader = DataLoader(Scores())
    runner = runner_of(kind, str(tmp_path))
    hook = EvalHook(loader, start=start, interval=interval, by_epoch=kind is EpochBasedRunner)
    hook.evaluate = MagicMock(return_value={})
    runner.register_hook(hook)
    if kind is EpochBasedRunner:
        runner._epoch = begin
    else:
        runner._iter = begin
    try:
        runner.run([loader], [('train', 1)], length)
    finally:
        runner.trainer.close()
    assert hook.evaluate.call_count == expected
    assert runner.iter == length if kind is IterBasedRunner else runner.epoch == length


def test_empty_result_warns_and_keeps_no_best(tmp_path):
    runner = runner_of(EpochBasedRunner, str(tmp_path))
    runner.register_hook(EvalHook(DataLoader(Scores(scores=())), save_best='auto'))
    with pytest.warns(UserWarning) as warned:
        try:
            runner.run([DataLoader(Scores())], [('train', 1)], 1)
        finally:
            runner.trainer.close()
    messages = [str(w.message) for w in warned]
    assert 'runner.meta is None. Creating an empty one.' in messages
    assert 'Since `eval_res` is an empty dict, the behavior to save the best checkpoint will be skipped in this ' \
           'evaluation.' in messages
    assert runner.meta == {'hook_msgs': {}} and not [n for n in os.listdir(tmp_path) if n.startswith('best_')]


@pytest.mark.parametrize('save_best, rule, best_epoch, best', [('auto', None, 4, 7), ('acc', None, 4, 7),
                                                                ('loss_top', None, 6, -3), ('acc', 'less', 6, -3)])
def test_best_checkpoint_in_meta_and_in_the_file(tmp_path, save_best, rule, best_epoch, best):
    runner = runner_of(EpochBasedRunner, str(tmp_path))
    runner.register_checkpoint_hook(dict(interval=1))
    hook = EvalHook(DataLoader(Scores()), save_best=save_best, rule=rule, greater_keys=['acc'],
                    less_keys=['loss_top'])
    runner.register_hook(hook)
    try:
        runner.run([DataLoader(Scores())], [('train', 1)], 8)
    finally:
        runner.trainer.close()
    metric = 'acc' if save_best == 'auto' else save_best
    path = os.path.join(str(tmp_path), f'best_{metric}_epoch_{best_epoch}.pth')
    assert runner.meta['hook_msgs']['best_ckpt'] == path and runner.meta['hook_msgs']['best_score'] == best
    # the best file records itself, as MMCV's EvalHook updates meta before saving it
    saved = load_checkpoint(path)['meta']['hook_msgs']
    assert saved['best_ckpt'] == path and saved['best_score'] == best
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith('best_') and n.endswith('.pth')) == \
        [os.path.basename(path)]


def test_resume_restores_the_meta_at_once(tmp_path):
    work_dir = str(tmp_path)
    runner = runner_of(EpochBasedRunner, work_dir)
    runner.register_checkpoint_hook(dict(interval=1))
    runner.register_hook(EvalHook(DataLoader(Scores()), save_best='acc'))
    try:
        runner.run([DataLoader(Scores())], [('train', 1)], 2)
    finally:
        runner.trainer.close()
    old = os.path.join(work_dir, 'best_acc_epoch_2.pth')
    assert runner.meta['hook_msgs'] == {'last_ckpt': os.path.join(work_dir, 'epoch_2.pth'), 'best_score': 4,
                                        'best_ckpt': old}
    runner = runner_of(EpochBasedRunner, work_dir)
    runner.register_checkpoint_hook(dict(interval=1))
    runner.register_hook(EvalHook(DataLoader(Scores()), save_best='acc'))
    runner.resume(old)
    assert runner.meta['hook_msgs']['best_ckpt'] == old and runner.meta['hook_msgs']['best_score'] == 4
    try:
        runner.run([DataLoader(Scores())], [('train', 1)], 8)
    finally:
        runner.trainer.close()
    # the fresh Scores starts its series again after the resume: 1, 4, 3, 7 at epochs 3..6
    assert runner.meta['hook_msgs']['best_ckpt'] == os.path.join(work_dir, 'best_acc_epoch_6.pth')
    assert runner.meta['hook_msgs']['best_score'] == 7 and not os.path.exists(old)
