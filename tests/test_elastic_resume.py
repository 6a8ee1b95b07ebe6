"""Elastic resume (issue 23 item 1): a checkpoint's position is kept in samples of the epoch's
order, so a resume with another batch size continues the interrupted epoch with the samples
not yet seen, each once, and the iteration counter (and so an iteration schedule) is re-based
to where a run with the new batch size would be. World sizes: tests/test_distributed.py."""
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import train_and_close as train
from resume_helpers import RecordIds as Record
from resume_helpers import StopAt
from hookloop import Trainer
from hookloop.errors import ConfigError

N = 40
BASE_LR = 0.1


def indexed_data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True), torch.arange(N))


class IdModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x, y, index):
        return nn.functional.mse_loss(self.net(x), y)


def make(work_dir, batch_size, hooks=(), by_epoch=False, **kwargs):
    torch.manual_seed(0)
    cfg = dict(optimizer=dict(type='SGD', lr=BASE_LR, momentum=0.9), max_epochs=3,
               train_dataloader=dict(batch_size=batch_size))
    return Trainer(IdModel(), optimizer=dict(type='SGD', lr=BASE_LR, momentum=0.9), max_epochs=3,
                   train_dataloader=DataLoader(indexed_data(), batch_size=batch_size, shuffle=True),
                   lr_config=dict(policy='CosineAnnealing', min_lr=0, by_epoch=False), work_dir=work_dir, seed=0,
                   device='cpu', log_config=dict(interval=100), custom_hooks=list(hooks),
                   checkpoint_config=dict(interval=1, by_epoch=by_epoch), cfg=cfg, **kwargs)


def cosine(t, total):
    return 0.5 * BASE_LR * (1 + math.cos(math.pi * t / total))


def check_lr(seen, total):
    for _, it, lr, _ in seen:
        assert math.isclose(lr, cosine(it, total), rel_tol=1e-9, abs_tol=1e-12), (it, lr)


def test_batch_size_doubled_at_an_epoch_boundary_runs_the_last_epoch_on_a_rebased_schedule(tmp_path, capsys):
    """Before: 'already complete at epoch 4 / iteration 20 (max_epochs=3): nothing to do'."""
    train(make(tmp_path, 4, hooks=[StopAt(19)], by_epoch=True))  # two epochs of 10 batches
    capsys.readouterr()
    record = Record()
    resumed = train(make(tmp_path, 8, hooks=[record], by_epoch=True, resume_from=str(tmp_path / 'epoch_2.pth')))
    out = capsys.readouterr().out
    assert 'iteration 20 is re-based to 10' in out
    assert [it for _, it, _, _ in record.seen] == list(range(10, 15))  # epoch 3, in batches of 8
    assert {epoch for epoch, *_ in record.seen} == {2}
    assert sorted(i for *_, ids in record.seen for i in ids) == list(range(N))
    check_lr(record.seen, 15)  # the LR is where a batch-8 run has it: 10/15 of the cosine
    assert resumed.iter == 15 and resumed.epoch == 3


def test_batch_size_halved_at_an_epoch_boundary_rebases_the_iteration_schedule(tmp_path):
    """Before: epoch 3 ran from iteration 20 of 60, the cosine at 20/60 instead of 40/60."""
    train(make(tmp_path, 4, hooks=[StopAt(19)], by_epoch=True))
    record = Record()
    resumed = train(make(tmp_path, 2, hooks=[record], by_epoch=True, resume_from=str(tmp_path / 'epoch_2.pth')))
    assert [it for _, it, _, _ in record.seen] == list(range(40, 60))
    check_lr(record.seen, 60)
    assert sorted(i for *_, ids in record.seen for i in ids) == list(range(N))
    assert resumed.iter == 60


def test_mid_epoch_resumes_with_other_batch_sizes_train_every_sample_of_the_epoch_once(tmp_path, capsys):
    """Batch 4, stopped after 3 batches of epoch 3 (12 samples); resumed with batch 8 for one
    batch (8 more), then with batch 5: the 20 left are batches 4..7 of a batch-5 epoch. Before:
    'batches per epoch changed from 10 to 5' was refused."""
    first, second, third = Record(), Record(), Record()
    train(make(tmp_path, 4, hooks=[first, StopAt(22)]))
    capsys.readouterr()
    train(make(tmp_path, 8, hooks=[second, StopAt(11)], resume_from='auto'))
    out = capsys.readouterr().out
    assert 'stopped after 12 of the 40 samples of epoch 3' in out and 'iteration 23 is re-based to 11' in out
    resumed = train(make(tmp_path, 5, hooks=[third], resume_from='auto'))
    assert [it for _, it, _, _ in second.seen] == [11]
    check_lr(second.seen, 15)
    assert [it for _, it, _, _ in third.seen] == [20, 21, 22, 23]  # 20 samples left: batches 4..7 of 8
    check_lr(third.seen, 24)
    assert [len(ids) for *_, ids in second.seen + third.seen] == [8, 5, 5, 5, 5]
    last_epoch = [i for epoch, _, _, ids in first.seen + second.seen + third.seen if epoch == 2 for i in ids]
    assert sorted(last_epoch) == list(range(N))  # each sample of the interrupted epoch once
    # ... in the epoch's own order: the resumed batches continue the permutation of epoch 3.
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0 + 2)).tolist()
    assert last_epoch == order
    assert resumed.iter == 24 and resumed.epoch == 3


def test_a_dataset_of_another_size_mid_epoch_is_refused_not_resplit(tmp_path):
    """The saved position names samples of the old order; a new dataset size has another."""
    train(make(tmp_path, 4, hooks=[StopAt(22)]))
    grown = make(tmp_path, 4, resume_from='auto')
    x = torch.randn(N + 8, 4)
    grown.set_train_dataloader(DataLoader(TensorDataset(x, x.sum(1, keepdim=True), torch.arange(N + 8)),
                                          batch_size=4, shuffle=True), max_epochs=3)
    with pytest.raises(ConfigError, match='batches per epoch changed from 10 to 12'):
        grown.train()
    grown.close()


def epoch_ids(records, epoch):
    return [i for record in records for e, _, _, ids in record.seen if e == epoch for i in ids]


def test_a_second_resume_in_a_re_split_epoch_trains_each_sample_once(tmp_path):
    """Issue 38 item 1: batch 4, stopped after 12 samples of epoch 3; resumed with batch 8, stopped
    after one more batch (20 samples); resumed with batch 8 again. Before: 44 samples in a
    40-sample epoch (the second resume saw 'the same shape' and reopened the unsplit order)."""
    first, second, third = Record(), Record(), Record()
    train(make(tmp_path, 4, hooks=[first, StopAt(22)]))
    train(make(tmp_path, 8, hooks=[second, StopAt(11)], resume_from='auto'))
    resumed = train(make(tmp_path, 8, hooks=[third], resume_from='auto'))
    assert [it for _, it, _, _ in third.seen] == [12, 13, 14]  # 20 left: batches 2..4 of 5
    last_epoch = epoch_ids((first, second, third), 2)
    assert last_epoch == torch.randperm(N, generator=torch.Generator().manual_seed(2)).tolist()
    check_lr(third.seen, 15)
    assert resumed.iter == 15 and resumed.epoch == 3


def test_train_again_after_a_stop_in_a_re_split_epoch_trains_each_sample_once(tmp_path):
    """The same after an elastic resume, a stop and train() again on the same trainer."""
    first, second = Record(), Record()
    train(make(tmp_path, 4, hooks=[first, StopAt(22)]))
    trainer = make(tmp_path, 8, hooks=[second, StopAt(11)], resume_from='auto')
    try:
        trainer.train()
        assert trainer.iter == 12 and trainer.stop_reason is not None
        trainer.train()
    finally:
        trainer.close()
    assert [it for _, it, _, _ in second.seen] == [11, 12, 13, 14]
    assert epoch_ids((first, second), 2) == torch.randperm(N, generator=torch.Generator().manual_seed(2)).tolist()
    assert trainer.iter == 15


def test_a_resume_whose_record_lines_up_with_the_new_batches_reads_the_uninterrupted_pass(tmp_path):
    """16 samples done in batches of 4: with batch 8 the rest is batches 2.. of the plain pass,
    so the resumed epoch is exactly the one a batch-8 run trains from its third batch."""
    first, second = Record(), Record()
    train(make(tmp_path, 4, hooks=[first, StopAt(23)]))
    train(make(tmp_path, 8, hooks=[second], resume_from='auto'))
    assert [it for _, it, _, _ in second.seen][:3] == [12, 13, 14]
    assert epoch_ids((first, second), 2) == torch.randperm(N, generator=torch.Generator().manual_seed(2)).tolist()
