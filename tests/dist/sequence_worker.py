"""One segment of a resume sequence (``tests/test_resume_sequences.py``): a trainer resumed with
``--resume auto`` (or started) in a work dir, with this segment's batch size, ``drop_last`` and
world size, trained until its stops, with ``train()`` again after each but the last.

In-process for one rank (:func:`run_segment`); under torchrun for two:
``python -m torch.distributed.run --nproc-per-node 2 sequence_worker.py WORK_DIR SPEC_JSON OUT_JSON``.

Every iteration's sample ids, over all ranks, are recorded by :class:`SequenceRecord`, whose
state is saved in each checkpoint: the final checkpoint holds exactly the batches the lineage
of resumes trained (those after a checkpoint a resume went back past are dropped with it).
"""
import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Hook, Trainer
from hookloop.priority import Priority

LR, MOMENTUM = 0.05, 0.9


def dataset(n, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator), torch.arange(n))


class IdModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, x, y, index):
        return nn.functional.mse_loss(self.net(x), y)


def initial_model(seed):
    torch.manual_seed(seed)
    return IdModel()


class SequenceRecord(Hook):
    """``seen``: per iteration ``[epoch, batch size, drop_last, [ids of rank 0], [ids of rank 1], ...]``
    (checkpointed)."""

    PRIORITY = Priority.LOWEST

    def __init__(self):
        self.seen = []

    def before_train_iter(self, trainer):
        ids = trainer.data_batch[2].tolist()  # the sample indices of this rank's batch
        if trainer.world_size > 1:
            import torch.distributed as dist
            gathered = [None] * trainer.world_size
            dist.all_gather_object(gathered, ids)
        else:
            gathered = [ids]
        sampler = trainer.train_dataloader.batch_sampler
        self.seen.append([trainer.epoch, sampler.batch_size, sampler.drop_last, *gathered])

    def state_dict(self):
        return {'seen': [list(entry) for entry in self.seen]}

    def load_state_dict(self, state):
        self.seen = [list(entry) for entry in state['seen']]


class StopAfter(Hook):
    """Requests a stop after ``counts[0]`` iterations of this train(), then ``counts[1]`` of the next, ..."""

    def __init__(self, counts):
        self.counts, self.done = list(counts), 0

    def before_run(self, trainer):
        self.done = 0

    def after_train_iter(self, trainer):
        self.done += 1
        if self.counts and self.counts[0] is not None and self.done == self.counts[0]:
            self.counts.pop(0)
            trainer.request_stop('sequence stop')


def run_segment(work_dir, spec):
    """Train one segment; returns what the test checks of it (rank 0's view)."""
    loader = DataLoader(dataset(spec['n'], spec['seed']), batch_size=spec['batch_size'], shuffle=True,
                        drop_last=spec['drop_last'])
    model = initial_model(spec['seed'])
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=LR, momentum=MOMENTUM), train_dataloader=loader,
                      max_epochs=spec['epochs'], work_dir=str(work_dir), seed=spec['seed'], device='cpu',
                      log_config=dict(interval=1000), resume_from='auto', log_level='INFO',
                      checkpoint_config=dict(interval=spec['interval'], by_epoch=False),
                      custom_hooks=[SequenceRecord(), StopAfter(spec['stops'])])
    try:
        for _ in spec['stops']:  # train(), then train() again on the same trainer after each stop
            trainer.train()
            if trainer.iter >= trainer.max_iters:
                break
    finally:
        trainer.close()
    return {'resumed_from': trainer.resumed_from, 'iter': trainer.iter, 'max_iters': trainer.max_iters}


def main():
    work_dir, spec, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    result = run_segment(work_dir, spec)
    if int(os.environ.get('RANK', '0')) == 0:
        with open(out, 'w', encoding='utf-8') as f:
            json.dump(result, f)


if __name__ == '__main__':
    main()
