"""Per-iteration overhead of hookloop's optimizer step over an equivalent plain PyTorch loop (CPU).

Each mode pairs a hookloop configuration with the plain loop that does the same math:

    base      OptimizerHook()                          vs  backward; step; zero_grad
    accum2    OptimizerHook(cumulative_iters=2)        vs  (loss / 2).backward(); step every 2nd iteration
    fp16      OptimizerHook(precision='fp16')          vs  autocast(fp16) + GradScaler('cpu')
    skip      + CheckInvalidLossHook(on_invalid='skip')      vs  the base plain loop (the cost of the check)
    rollback  + CheckInvalidLossHook(on_invalid='rollback')  vs  the base plain loop

The two loops run interleaved in rounds (plain, hookloop, plain, ...) so drift in machine
speed hits both alike; each iteration is stamped at its end and the figure is the median gap,
then the median over rounds. ``--clock thread`` (the default) stamps with the main thread's CPU
time (``time.thread_time``; torch runs single-threaded here), which stays meaningful on a machine
shared with other jobs; ``--clock wall`` uses ``time.perf_counter``.

    PYTHONPATH=. python bench/optimizer_overhead.py
    PYTHONPATH=. python bench/optimizer_overhead.py --models tiny --modes accum2,fp16 --rounds 7
"""
import argparse
import json
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Hook, Trainer

CLOCK = [time.thread_time]

MODELS = {
    # name: (build, features, batch)
    'tiny': (lambda: nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)), 32, 32),
    'mlp': (lambda: nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.ReLU())],
                                  nn.Linear(1024, 1)), 1024, 256),
}
MODES = {
    'base': (dict(), None),
    'accum2': (dict(cumulative_iters=2), None),
    'fp16': (dict(precision='fp16'), None),
    'skip': (dict(), dict(type='CheckInvalidLossHook', on_invalid='skip')),
    'rollback': (dict(), dict(type='CheckInvalidLossHook', on_invalid='rollback', interval=50)),
}


class Loss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def make_data(features, batch, iters):
    generator = torch.Generator().manual_seed(0)
    n = batch * iters
    return TensorDataset(torch.randn(n, features, generator=generator), torch.randn(n, 1, generator=generator))


def plain_loop(mode, model, data, batch, stamps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=batch, drop_last=True)
    scaler = torch.amp.GradScaler('cpu') if mode == 'fp16' else None
    model.train()
    for i, (x, y) in enumerate(loader):
        if scaler is not None:
            with torch.autocast('cpu', dtype=torch.float16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        elif mode == 'accum2':
            (model(x, y) / 2).backward()
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        else:
            model(x, y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        stamps.append(CLOCK[0]())


class Stamp(Hook):
    def __init__(self, stamps):
        self.stamps = stamps

    def after_train_iter(self, trainer):
        self.stamps.append(CLOCK[0]())


def hookloop_loop(mode, model, data, batch, stamps, work_dir):
    optimizer_config, check = MODES[mode]
    loader = DataLoader(data, batch_size=batch, drop_last=True)
    trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                      train_dataloader=loader, max_epochs=1, work_dir=work_dir, seed=0, device='cpu',
                      log_level='WARNING', optimizer_config=optimizer_config, custom_hooks=[check] if check else None)
    trainer.register_hook(Stamp(stamps), priority='LOWEST')
    trainer.train()
    trainer.close()


def median_gap_us(stamps, warmup):
    gaps = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
    return statistics.median(gaps) * 1e6


def run(model_name, mode, rounds, iters, work_dir):
    build, features, batch = MODELS[model_name]
    data = make_data(features, batch, iters)
    torch.manual_seed(0)
    initial = Loss(build()).state_dict()
    results = {'plain': [], 'hookloop': []}
    warmup = max(iters // 10, 2)
    for _ in range(rounds):
        for name in ('plain', 'hookloop'):
            model = Loss(build())
            model.load_state_dict(initial)
            stamps = []
            if name == 'plain':
                plain_loop(mode, model, data, batch, stamps)
            else:
                hookloop_loop(mode, model, data, batch, stamps, work_dir)
            results[name].append(median_gap_us(stamps, warmup))
    plain_us = statistics.median(results['plain'])
    hook_us = statistics.median(results['hookloop'])
    return {'model': model_name, 'mode': mode, 'iters': iters, 'rounds': rounds, 'clock': CLOCK[0].__name__,
            'plain_us': round(plain_us, 1),
            'hookloop_us': round(hook_us, 1), 'ratio': round(hook_us / plain_us, 4)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', default='tiny,mlp')
    parser.add_argument('--modes', default=','.join(MODES))
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=0, help='iterations per round (default: 1000 tiny, 40 mlp)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--clock', choices=('thread', 'wall'), default='thread')
    parser.add_argument('--work-dir', default='/tmp/hookloop-bench-optimizer')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.thread_time if args.clock == 'thread' else time.perf_counter
    for name in args.models.split(','):
        for mode in args.modes.split(','):
            iters = args.iters or {'tiny': 1000, 'mlp': 40}[name]
            print(json.dumps(run(name, mode, args.rounds, iters, args.work_dir)), flush=True)


if __name__ == '__main__':
    main()
