"""Logging overhead: a plain PyTorch loop vs hookloop with text + TensorBoard logging.

Tiny model (Linear 32-32-1, batch 32) so that per-iteration overhead dominates. The
variants run interleaved in one process, several rounds each; we report the median
microseconds per iteration and the ratio to the plain loop.

    PYTHONPATH=. python bench/logging_overhead.py [--iters 500] [--rounds 7]
"""
import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Trainer


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def make_loader(iters):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(iters * 32, 32, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)


def plain(loader, iters):
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for x, y in loader:
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / iters


def hookloop(loader, iters, hooks, root):
    trainer = Trainer(Tiny(), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader, max_iters=iters,
                      work_dir=tempfile.mkdtemp(dir=root), seed=0, device='cpu',
                      log_config=dict(interval=10, hooks=hooks))
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    trainer.close()
    return elapsed / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--iters', type=int, default=500)
    parser.add_argument('--rounds', type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loader = make_loader(args.iters)
    variants = {
        'plain loop': lambda root: plain(loader, args.iters),
        'hookloop text': lambda root: hookloop(loader, args.iters, [dict(type='TextLoggerHook')], root),
        'hookloop text+tensorboard': lambda root: hookloop(
            loader, args.iters, [dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook')], root),
    }
    times = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as root:
        for name, run in variants.items():  # warm-up: imports, first allocations
            with open(os.devnull, 'w') as devnull, contextlib.redirect_stdout(devnull):
                run(root)
        for _ in range(args.rounds):
            for name, run in variants.items():
                with open(os.devnull, 'w') as devnull, contextlib.redirect_stdout(devnull):
                    times[name].append(run(root))
    base = statistics.median(times['plain loop'])
    print(f'torch {torch.__version__}, {args.iters} iterations x {args.rounds} rounds, interval 10, 1 thread',
          file=sys.stderr)
    print(f'{"variant":<28}{"median us/iter":>16}{"ratio":>8}')
    for name, values in times.items():
        median = statistics.median(values)
        print(f'{name:<28}{median * 1e6:>16.1f}{median / base:>8.3f}')


if __name__ == '__main__':
    main()
