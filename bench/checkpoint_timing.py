"""Checkpoint timings: save and load of a 100 MB model, and the time to resume in the middle
of a 10,000-batch epoch versus at its start.

    PYTHONPATH=. python bench/checkpoint_timing.py [--repeats 3] [--device cpu|cuda]

Prints a table (median of ``--repeats`` runs). The resume time is measured from
``trainer.train()`` to the first ``before_train_iter``: loading the checkpoint, restoring
every state, starting the sampler at the saved position and fetching the first batch. For
comparison it also times what a trainer without a resumable sampler does (ModelScope's way):
fetch and drop the batches already done.
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookloop import Hook, Trainer
from hookloop.checkpoint import load_checkpoint, save_checkpoint


class Tokens(Dataset):
    """Cheap samples: the cost measured is the loader's, not the dataset's."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return torch.full((16,), float(index)), torch.zeros(1)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 1)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.fc(x), y)


class StopAtFirstIteration(Hook):
    """Records when the first iteration starts and stops the run there."""

    def before_train_iter(self, trainer):
        self.reached = time.perf_counter()
        trainer.request_stop('benchmark')


def time_save_load(size_mb, device, repeats, directory):
    model = nn.Linear(1024, size_mb * 256, bias=False).to(device)  # 1024 * 256 float32 = 1 MB per size_mb
    state = {'meta': {'iter': 0}, 'state_dict': model.state_dict()}
    path = os.path.join(directory, 'big.pth')
    saves, loads, plain = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        save_checkpoint(state, path)  # temp file, fsync, rename
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.save(state, path + '.plain')  # no fsync, no rename: what the safety costs
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        load_checkpoint(path, map_location=device)  # weights_only=True
        loads.append(time.perf_counter() - start)
    os.remove(path + '.plain')
    return os.path.getsize(path) / 2 ** 20, statistics.median(saves), statistics.median(plain), statistics.median(loads)


def make_trainer(work_dir, batches, batch_size, resume_from=None):
    torch.manual_seed(0)
    loader = DataLoader(Tokens(batches * batch_size), batch_size=batch_size, shuffle=True)
    return Trainer(Tiny(), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader, max_epochs=1,
                   work_dir=work_dir, seed=0, device='cpu', resume_from=resume_from, log_level='WARNING',
                   log_config=dict(interval=10 ** 9), custom_hooks=[StopAtFirstIteration()])


def time_resume(position, batches, batch_size, directory):
    work_dir = os.path.join(directory, f'resume_{position}')
    trainer = make_trainer(work_dir, batches, batch_size)
    trainer.resolve_hooks()
    trainer.iter = trainer.inner_iter = position  # the state after `position` iterations
    path = trainer.save_checkpoint('checkpoint.pth')
    trainer.close()
    trainer = make_trainer(work_dir, batches, batch_size, resume_from=path)
    hook = next(h for h in trainer.hooks if isinstance(h, StopAtFirstIteration))
    start = time.perf_counter()
    trainer.train()
    trainer.close()
    return hook.reached - start


def time_skip_by_iterating(position, batches, batch_size):
    loader = DataLoader(Tokens(batches * batch_size), batch_size=batch_size, shuffle=True)
    start = time.perf_counter()
    iterator = iter(loader)
    for _ in range(position):
        next(iterator)
    next(iterator)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--size-mb', type=int, default=100)
    parser.add_argument('--batches', type=int, default=10_000)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_DIR')) as directory:
        size, save, plain, load = time_save_load(args.size_mb, args.device, args.repeats, directory)
        print(f'checkpoint of {size:.1f} MB ({args.device}): atomic save {save:.3f} s '
              f'(plain torch.save {plain:.3f} s), weights_only load {load:.3f} s')
        middle = args.batches // 2
        rows = []
        for label, position in (('start', 0), ('middle', middle)):
            times = [time_resume(position, args.batches, args.batch_size, directory) for _ in range(args.repeats)]
            rows.append((label, position, statistics.median(times)))
        skip = statistics.median(time_skip_by_iterating(middle, args.batches, args.batch_size)
                                 for _ in range(args.repeats))
    print(f'resume in a {args.batches}-batch epoch (batch {args.batch_size}), train() to first iteration:')
    for label, position, seconds in rows:
        print(f'  at the {label:<6} (batch {position:>5}): {seconds:.3f} s')
    print(f'  for comparison, fetching and dropping {middle} batches (no resumable sampler): {skip:.3f} s')


if __name__ == '__main__':
    main()
