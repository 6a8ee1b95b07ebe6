"""Per-iteration overhead of hookloop over a plain PyTorch loop, measured in one process.

The same model, data, initial weights and optimizer run under both loops, interleaved
in rounds (plain, hookloop, plain, ...) so drift in machine speed hits both alike.
Each iteration is stamped at its end; the figure is the median of the stamp gaps.

    python bench/overhead.py                       # tiny and mlp, default hooks
    python bench/overhead.py --models tiny --rounds 7 --iters 600
    python bench/overhead.py --optimizer-config "dict(cumulative_iters=2)"
"""
import argparse
import ast
import json
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Hook, Trainer

MODELS = {
    # name: (build, features, batch)
    'tiny': (lambda: nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)), 32, 32),
    'mlp': (lambda: nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.ReLU())],
                                  nn.Linear(1024, 1)), 1024, 256),
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


def plain_loop(model, data, batch, stamps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
    model.train()
    for x, y in loader:
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stamps.append(time.perf_counter())


class Stamp(Hook):
    def __init__(self, stamps):
        self.stamps = stamps

    def after_train_iter(self, trainer):
        self.stamps.append(time.perf_counter())


def hookloop_loop(model, data, batch, stamps, work_dir, hook_cfgs):
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
    trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                      train_dataloader=loader, max_epochs=1, work_dir=work_dir, seed=0, device='cpu',
                      log_level='WARNING', **hook_cfgs)
    trainer.register_hook(Stamp(stamps), priority='LOWEST')
    trainer.train()
    trainer.close()


def median_gap_us(stamps, warmup):
    gaps = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
    return statistics.median(gaps) * 1e6


def run(model_name, rounds, iters, work_dir, hook_cfgs):
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
                plain_loop(model, data, batch, stamps)
            else:
                hookloop_loop(model, data, batch, stamps, work_dir, hook_cfgs)
            results[name].append(median_gap_us(stamps, warmup))
    plain_us = statistics.median(results['plain'])
    hook_us = statistics.median(results['hookloop'])
    return {'model': model_name, 'iters': iters, 'rounds': rounds, 'plain_us': round(plain_us, 1),
            'hookloop_us': round(hook_us, 1), 'ratio': round(hook_us / plain_us, 4), 'hooks': repr(hook_cfgs)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', default='tiny,mlp')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=0, help='iterations per round (default: 1000 tiny, 60 mlp)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--work-dir', default='/tmp/hookloop-bench')
    for role in ('optimizer_config', 'lr_config', 'log_config', 'custom_hooks'):
        parser.add_argument('--' + role.replace('_', '-'), help=f'{role} as a Python literal')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hook_cfgs = {}
    for role in ('optimizer_config', 'lr_config', 'log_config', 'custom_hooks'):
        value = getattr(args, role)
        if value:
            hook_cfgs[role] = eval(value, {'dict': dict}) if value.startswith('dict(') or value.startswith('[') \
                else ast.literal_eval(value)
    for name in args.models.split(','):
        iters = args.iters or {'tiny': 1000, 'mlp': 60}[name]
        print(json.dumps(run(name, args.rounds, iters, args.work_dir, hook_cfgs)), flush=True)


if __name__ == '__main__':
    main()
