"""Elastic resume across world sizes (issue 23), the per-rank program of
``tests/test_distributed.py::test_elastic_resume_*``:

* ``save OUT``: on this world size, with DDP and then FSDP2 (each with EMA), train 48 samples
  in per-rank batches of 4 for 3 epochs, saving a checkpoint at an epoch boundary and one
  mid-epoch (capturing the full model / momentum / EMA there);
* ``resume OUT SOURCE_WORLD``: resume each of those checkpoints of a ``SOURCE_WORLD`` run here
  (capturing the full state before the first iteration), to the end.

Every iteration's (epoch, iter, lr, sample ids) of each rank is written to ``OUT`` for the test.
"""
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
import worker as W  # noqa: E402

from hookloop import Trainer  # noqa: E402
from hookloop.hooks.base import Hook  # noqa: E402
from hookloop.priority import Priority  # noqa: E402

N, BATCH, EPOCHS, LR = 48, 4, 3, 0.1
STRATEGIES = ('ddp', 'fsdp')


def save_points(world):
    """(epoch boundary, mid-epoch) checkpoints, in iterations of a ``world``-rank run."""
    per_epoch = N // (BATCH * world)
    return per_epoch, per_epoch + 2


class IdClassifier(W.Classifier):
    def forward(self, x, label, index):
        return super().forward(x, label)


def data():
    x, label = W.make_data(N, 0).tensors
    return TensorDataset(x, label, torch.arange(N))


class Record(Hook):
    PRIORITY = Priority.LOWEST

    def __init__(self):
        self.seen = []

    def before_train_iter(self, trainer):
        self.seen.append((trainer.epoch, trainer.iter, trainer.optimizer.param_groups[0]['lr'],
                          trainer.data_batch[2].tolist()))


def full_state(trainer):
    """Model, momentum and EMA tensors, gathered whole (a collective under FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer,
                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    ema = next(hook for hook in trainer.hooks if type(hook).__name__ == 'EMAHook')
    averages = {name: (t.full_tensor() if hasattr(t, 'full_tensor') else t).detach().clone()
                for name, t in sorted(ema.averages.items())}
    return {'model': {k: v.clone() for k, v in model_state.items()},
            'momentum': {k: v['momentum_buffer'].clone() for k, v in optim_state.get('state', {}).items()},
            'ema': averages, 'iter': trainer.iter}


class SaveAt(Hook):
    """Saves ``<tag>_<n>.pth`` after iteration ``n`` (1-based) for each ``n`` of ``points``,
    and the full state there to ``OUT``."""
    PRIORITY = Priority.LOWEST

    def __init__(self, out, tag, points):
        self.out, self.tag, self.points = out, tag, points

    def after_train_iter(self, trainer):
        n = trainer.iter + 1
        if n in self.points:
            trainer.save_checkpoint(f'{self.tag}_{n}.pth', update_last=False)
            state = full_state(trainer)
            if trainer.rank == 0:
                torch.save(state, os.path.join(self.out, f'saved_{self.tag}_{n}.pt'))


class CaptureFirst(Hook):
    PRIORITY = Priority.LOWEST

    def __init__(self, path):
        self.path, self.done = path, False

    def before_train_iter(self, trainer):
        if not self.done:
            self.done = True
            state = full_state(trainer)
            if trainer.rank == 0:
                torch.save(state, self.path)


def make(out, world, strategy, hooks, **kwargs):
    torch.manual_seed(W.SEED)
    return Trainer(IdClassifier(), optimizer=dict(type='SGD', lr=LR, momentum=W.MOMENTUM),
                   train_dataloader=DataLoader(data(), batch_size=BATCH, shuffle=True), max_epochs=EPOCHS,
                   seed=W.SEED, device='cpu', strategy=strategy if world > 1 or strategy == 'fsdp' else None,
                   lr_config=dict(policy='CosineAnnealing', min_lr=0, by_epoch=False),
                   custom_hooks=[dict(type='EMAHook', momentum=0.1, warm_up=1), *hooks],
                   checkpoint_config=dict(interval=-1, save_last=False), log_level='WARNING',
                   work_dir=os.path.join(out, f'work_{strategy}_w{world}_{kwargs.pop("name", "save")}'), **kwargs)


def run(trainer, record, path):
    trainer.train()
    torch.save(record.seen, path)
    trainer.close()


def main():
    """``MODES OUT [SOURCE_WORLD]``: ``save``, ``resume`` or ``save,resume`` (one launch for both)."""
    modes, out = sys.argv[1].split(','), sys.argv[2]
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    for mode in modes:
        for strategy in STRATEGIES:
            if mode == 'save':
                tag = f'{strategy}_w{world}'
                record = Record()
                trainer = make(out, world, strategy, [record, SaveAt(out, tag, save_points(world))])
                run(trainer, record, os.path.join(out, f'records_{tag}_rank{rank}.pt'))
                continue
            source = int(sys.argv[3])
            for n in save_points(source):
                tag = f'{strategy}_w{source}_{n}_on_w{world}'
                path = os.path.join(out, f'work_{strategy}_w{source}_save', f'{strategy}_w{source}_{n}.pth')
                record = Record()
                trainer = make(out, world, strategy, [record, CaptureFirst(os.path.join(out, f'loaded_{tag}.pt'))],
                               resume_from=path, name=f'from_w{source}_{n}')
                run(trainer, record, os.path.join(out, f'records_{tag}_rank{rank}.pt'))


if __name__ == '__main__':
    main()
