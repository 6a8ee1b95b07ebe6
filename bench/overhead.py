"""Per-iteration overhead of hookloop over a plain PyTorch loop doing the same math (CPU).

Each mode pairs a hookloop configuration with the plain loop that does the same work:

    default   the default hooks (optimizer step, timer, text log every 10)  vs  backward; step; zero_grad
    accum2    OptimizerHook(cumulative_iters=2)        vs  (loss / 2).backward(); step every 2nd iteration
    fp16      OptimizerHook(precision='fp16')          vs  autocast(fp16) + GradScaler('cpu')
    skip      + CheckInvalidLossHook(on_invalid='skip')      vs  the default plain loop (the check's cost)
    rollback  + CheckInvalidLossHook(on_invalid='rollback')  vs  the default plain loop
    logging   text + TensorBoard logging every 10 iterations vs  the default plain loop
    default50, accum2_50, tensorboard50: as default / accum2 / logging, with the text log every 50
              iterations and a checkpoint per epoch (the set-up the per-iteration budget is set for)

Models: ``tiny`` = Linear(32,32)-ReLU-Linear(32,1), batch 32 (overhead-bound); ``mlp`` =
4 x Linear(1024,1024)+ReLU, Linear(1024,1), batch 256 (compute-bound). Same data, initial
weights and SGD(momentum 0.9); shuffled loader; one torch thread.

The loops run interleaved in rounds (plain, hookloop, plain, ...) so drift in machine speed hits
both alike; each iteration is stamped at its end; the figure is the median gap, then the median
over rounds. ``--clock wall`` (default) stamps with ``time.perf_counter``; ``--clock thread``
with the main thread's CPU time, which stays meaningful on a machine shared with other jobs.

    python bench/overhead.py                                   # default mode, tiny and mlp
    python bench/overhead.py --models tiny --modes default,accum2,fp16,logging --rounds 7
"""
import argparse
import json
import statistics
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Hook, Trainer

MODELS = {
    # name: (build, features, batch, default iterations per round)
    'tiny': (lambda: nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)), 32, 32, 1000),
    'mlp': (lambda: nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.ReLU())],
                                  nn.Linear(1024, 1)), 1024, 256, 60),
}
# mode: hookloop's extra Trainer arguments
MODES = {
    'default': {},
    'accum2': dict(optimizer_config=dict(cumulative_iters=2)),
    'fp16': dict(optimizer_config=dict(precision='fp16')),
    'skip': dict(custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='skip')]),
    'rollback': dict(custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='rollback')]),
    'logging': dict(log_config=dict(interval=10, hooks=[dict(type='TextLoggerHook'),
                                                        dict(type='TensorboardLoggerHook')])),
    # The issue-15 set-up: text log every 50 iterations and a checkpoint per epoch.
    'default50': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1)),
    'accum2_50': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1),
                      optimizer_config=dict(cumulative_iters=2)),
    'tensorboard50': dict(log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook'),
                                                              dict(type='TensorboardLoggerHook')]),
                          checkpoint_config=dict(interval=1)),
}
PLAIN_MODE = {'accum2_50': 'accum2'}  # the plain loop each hookloop mode is compared with (default: its math)
clock = time.perf_counter


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


def plain_loop(mode, model, loader, stamps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
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
        elif PLAIN_MODE.get(mode, mode) == 'accum2':
            (model(x, y) / 2).backward()
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        else:
            model(x, y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        stamps.append(clock())


class Stamp(Hook):
    def __init__(self, stamps):
        self.stamps = stamps

    def after_train_iter(self, trainer):
        self.stamps.append(clock())


def hookloop_loop(mode, model, loader, stamps):
    trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                      train_dataloader=loader, max_epochs=1, work_dir=tempfile.mkdtemp(prefix='hookloop-bench-'),
                      seed=0, device='cpu', log_level='WARNING', **MODES[mode])
    trainer.register_hook(Stamp(stamps), priority='LOWEST')
    trainer.train()
    trainer.close()


def median_gap_us(stamps, warmup):
    gaps = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
    return statistics.median(gaps) * 1e6


def run(model_name, mode, rounds, iters):
    build, features, batch, default_iters = MODELS[model_name]
    iters = iters or default_iters
    data = make_data(features, batch, iters)
    torch.manual_seed(0)
    initial = Loss(build()).state_dict()
    results = {'plain': [], 'hookloop': []}
    warmup = max(iters // 10, 2)
    for _ in range(rounds):
        for name, loop in (('plain', plain_loop), ('hookloop', hookloop_loop)):
            model = Loss(build())
            model.load_state_dict(initial)
            stamps = []
            loop(mode, model, DataLoader(data, batch_size=batch, shuffle=True, drop_last=True), stamps)
            results[name].append(median_gap_us(stamps, warmup))
    plain_us, hook_us = statistics.median(results['plain']), statistics.median(results['hookloop'])
    return {'model': model_name, 'mode': mode, 'iters': iters, 'rounds': rounds, 'clock': clock.__name__,
            'plain_us': round(plain_us, 1), 'hookloop_us': round(hook_us, 1), 'ratio': round(hook_us / plain_us, 4),
            'framework_us': round(statistics.median(h - p for p, h in zip(results['plain'], results['hookloop'])), 1)}


def main():
    global clock
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', default='tiny,mlp')
    parser.add_argument('--modes', default='default', help=f'comma-separated, from {", ".join(MODES)}')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=0, help='iterations per round (default: 1000 tiny, 60 mlp)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--clock', choices=('wall', 'thread'), default='wall')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == 'thread' else time.perf_counter
    for name in args.models.split(','):
        for mode in args.modes.split(','):
            print(json.dumps(run(name, mode, args.rounds, args.iters)), flush=True)


if __name__ == '__main__':
    main()
