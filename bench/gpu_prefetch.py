"""Device prefetch on CUDA: time per iteration with the next batch copied on a side stream while
the current step runs (``device_prefetch=True``, the default) against copying it in the loop
(``device_prefetch=False``), for batches large enough that the host-to-device copy matters.

Checks (exit 1 otherwise): both runs end with bitwise equal weights, and the prefetching run is
not slower than ``--max-ratio`` (default 1.02) times the other. Prints one JSON line with the
median ms per iteration of each (interleaved rounds) and the overlap gained.

    PYTHONPATH=. python bench/gpu_prefetch.py             # needs a CUDA device
"""
import argparse
import json
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Hook, Trainer


class Stamp(Hook):
    def __init__(self):
        self.times = []

    def after_train_iter(self, trainer):
        torch.cuda.synchronize()  # benchmark only: each stamp is the end of the iteration's work
        self.times.append(time.perf_counter())


class Regression(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 1024), nn.ReLU(), nn.Linear(1024, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def run(prefetch, data, features, batch):
    torch.manual_seed(0)
    model = Regression(features)
    stamp = Stamp()
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=1e-4), max_epochs=1, seed=0, device='cuda',
                      train_dataloader=DataLoader(data, batch_size=batch), work_dir=tempfile.mkdtemp(),
                      log_level='WARNING', log_config=dict(interval=10 ** 9),
                      device_prefetch=prefetch)
    trainer.register_hook(stamp, priority='LOWEST')
    trainer.train()
    trainer.close()
    gaps = [b - a for a, b in zip(stamp.times[2:], stamp.times[3:])]
    return statistics.median(gaps), {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--features', type=int, default=4096)
    parser.add_argument('--batch', type=int, default=2048)  # 32 MB of float32 inputs per batch
    parser.add_argument('--iters', type=int, default=60)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--max-ratio', type=float, default=1.02)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit('bench/gpu_prefetch.py needs a CUDA device (on the CPU the trainer does not prefetch)')
    generator = torch.Generator().manual_seed(0)
    n = args.batch * args.iters
    data = TensorDataset(torch.randn(n, args.features, generator=generator), torch.randn(n, 1, generator=generator))
    times = {True: [], False: []}
    weights = {}
    for _ in range(args.rounds):
        for prefetch in (False, True):
            seconds, weights[prefetch] = run(prefetch, data, args.features, args.batch)
            times[prefetch].append(seconds)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    result = {'batch_mb': round(args.batch * args.features * 4 / 2 ** 20, 1), 'prefetch_ms': round(on * 1e3, 3),
              'no_prefetch_ms': round(off * 1e3, 3), 'ratio': round(on / off, 4), 'gpu': torch.cuda.get_device_name()}
    print(json.dumps(result))
    failures = []
    if any(not torch.equal(weights[True][k], weights[False][k]) for k in weights[False]):
        failures.append('prefetching changed the final weights')
    if on > args.max_ratio * off:
        failures.append(f'prefetching is slower: {on * 1e3:.3f} ms vs {off * 1e3:.3f} ms per iteration')
    for failure in failures:
        print('FAIL:', failure, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == '__main__':
    main()
