"""fp16 / bf16 on CUDA: hookloop's OptimizerHook against the plain AMP recipe, for a small convnet.

For each case the same initial weights and batches go through the plain PyTorch loop and through
a Trainer; the script checks (and exits non-zero unless) the final weights, BatchNorm buffers and
loss-scale sequences are identical, with cuDNN/cuBLAS in deterministic mode, and that the fp16
case really overflowed (skipped steps, scale backed off). Then it times both loops, interleaved,
and prints one JSON line per case: median ms per iteration and the ratio.

    PYTHONPATH=. python bench/gpu_amp.py                  # needs a CUDA device
    PYTHONPATH=. python bench/gpu_amp.py --iters 200 --rounds 5
"""
import os

os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # before CUDA starts: deterministic cuBLAS

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hookloop import Hook, Trainer  # noqa: E402

CASES = {
    # name: (optimizer_config, autocast dtype, scaler kwargs or None, cumulative iters)
    'fp32': (dict(), None, None, 1),
    'fp16': (dict(precision='fp16', loss_scale=dict(init_scale=2. ** 24, growth_interval=20)),
             torch.float16, dict(init_scale=2. ** 24, growth_interval=20), 1),
    'fp16_accum2_clip': (dict(precision='fp16', cumulative_iters=2, grad_clip=dict(max_norm=1.0),
                              loss_scale=dict(init_scale=2. ** 24, growth_interval=20)),
                         torch.float16, dict(init_scale=2. ** 24, growth_interval=20), 2),
    'bf16': (dict(precision='bf16'), torch.bfloat16, None, 1),
}


class ConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            # strided convolutions and a mean instead of pooling layers: their CUDA backward
            # kernels are not deterministic, and the check compares bit for bit
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU())
        self.head = nn.Linear(128, classes)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.features(x).mean(dim=(2, 3))), y)


def make_data(iters, batch):
    generator = torch.Generator().manual_seed(0)
    n = iters * batch
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=generator),
                         torch.randint(0, 10, (n,), generator=generator))


class Scales(Hook):
    PRIORITY = 'LOWEST'

    def __init__(self):
        self.values = []

    def after_train_iter(self, trainer):
        if 'loss_scale' in trainer.meters:
            self.values = list(trainer.meters._values['loss_scale'])


def synchronize(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def plain(case, model, data, batch, device):
    _, dtype, scaler_kwargs, n = CASES[case]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device, **scaler_kwargs) if scaler_kwargs else None
    loader = DataLoader(data, batch_size=batch)
    scales = []
    synchronize(device)
    start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        size = min(n, len(loader) - (i - i % n))
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(x, y)
        loss = loss / size if size > 1 else loss
        (scaler.scale(loss) if scaler else loss).backward()
        if i % n != size - 1:
            continue
        if scaler is not None:
            if case.endswith('clip'):
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scales.append(scaler.get_scale())
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return (time.perf_counter() - start) / len(loader), scales


def hookloop(case, model, data, batch, work_dir, device):
    optimizer_config = CASES[case][0]
    recorder = Scales()
    trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(data, batch_size=batch), max_epochs=1, work_dir=work_dir,
                      seed=0, device=device, log_level='WARNING', optimizer_config=dict(optimizer_config),
                      custom_hooks=[recorder], log_config=dict(interval=10 ** 9))
    synchronize(device)
    start = time.perf_counter()
    trainer.train()
    synchronize(device)
    elapsed = (time.perf_counter() - start) / trainer.iter
    trainer.close()
    return elapsed, [t.item() for t in recorder.values]


def check(case, data, batch, work_dir, device):
    """Same weights, buffers and scales from both loops; returns a list of failures."""
    torch.manual_seed(0)
    a = ConvNet().to(device)
    b = ConvNet().to(device)
    b.load_state_dict(a.state_dict())
    _, plain_scales = plain(case, a, data, batch, device)
    _, hook_scales = hookloop(case, b, data, batch, work_dir, device)
    failures = []
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        if not torch.equal(x, y):
            failures.append(f'{case}: {name} differs by {(x.float() - y.float()).abs().max().item():.3g}')
    if plain_scales != hook_scales:
        failures.append(f'{case}: loss scales differ: plain {plain_scales[:6]}..., hookloop {hook_scales[:6]}...')
    if CASES[case][2] and not any(s2 < s1 for s1, s2 in zip(plain_scales, plain_scales[1:])):
        failures.append(f'{case}: no overflow happened, the skip path was not exercised')
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cases', default=','.join(CASES))
    parser.add_argument('--iters', type=int, default=100, help='iterations per timed run')
    parser.add_argument('--check-iters', type=int, default=30)
    parser.add_argument('--batch', type=int, default=128)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--device', default='cuda', help="'cpu' runs the same checks slowly (a dry run)")
    args = parser.parse_args()
    device = args.device
    if device == 'cuda' and not torch.cuda.is_available():
        sys.exit('bench/gpu_amp.py needs a CUDA device (or --device cpu for a dry run)')
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)  # the equality check is the judge
    work_dir = tempfile.mkdtemp(prefix='hookloop-gpu-amp-')
    failures = []
    check_data = make_data(args.check_iters, args.batch)
    time_data = make_data(args.iters, args.batch)
    for case in args.cases.split(','):
        failures += check(case, check_data, args.batch, work_dir, device)
        times = {'plain': [], 'hookloop': []}
        for _ in range(args.rounds):
            for name in times:
                torch.manual_seed(0)
                model = ConvNet().to(device)
                run = plain(case, model, time_data, args.batch, device) if name == 'plain' else \
                    hookloop(case, model, time_data, args.batch, work_dir, device)
                times[name].append(run[0])
        plain_ms, hook_ms = (statistics.median(times[k]) * 1e3 for k in ('plain', 'hookloop'))
        name = torch.cuda.get_device_name() if device == 'cuda' else 'cpu'
        print(json.dumps({'case': case, 'device': name, 'batch': args.batch,
                          'iters': args.iters, 'plain_ms': round(plain_ms, 3), 'hookloop_ms': round(hook_ms, 3),
                          'ratio': round(hook_ms / plain_ms, 4)}), flush=True)
    for failure in failures:
        print('FAIL', failure, flush=True)
    print('equivalence:', 'FAILED' if failures else 'all cases identical', flush=True)
    sys.exit(1 if failures else 0)


if __name__ == '__main__':
    main()
