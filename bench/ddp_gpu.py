"""Step time of hookloop under torchrun + NCCL vs a plain PyTorch loop, fp16 / bf16.

Run on a CUDA machine (one GPU is enough):

    torchrun --standalone --nproc-per-node 1 bench/ddp_gpu.py --dtype bf16
    torchrun --standalone --nproc-per-node 1 bench/ddp_gpu.py --dtype fp16
    torchrun --standalone --nproc-per-node 8 bench/ddp_gpu.py --dtype bf16   # more GPUs

Both sides: the same MLP, the same pinned CPU batches copied to the GPU each step,
autocast to ``--dtype`` (fp16 adds a GradScaler), the same DDP wrapper. The plain side
is the loop a user would write; hookloop's is ``Trainer(strategy='ddp')`` with its
default hooks (timer, text logger every 50 iterations). Rank 0 prints one JSON line:
milliseconds per step (median of ``--repeats`` timed windows) and the ratio.

``--device cpu --dist-backend gloo --width 64`` smoke-tests the script without a GPU.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..')))

from hookloop import Trainer  # noqa: E402
from hookloop.hooks.base import Hook  # noqa: E402

DTYPES = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
PRECISION = {'fp32': None, 'bf16': 'bf16', 'fp16': 'fp16'}


class MLP(nn.Module):
    def __init__(self, width, depth, classes=10):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x, label):
        return {'loss': nn.functional.cross_entropy(self.head(self.body(x)), label)}


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def autocast(device, dtype):
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


class Windows(Hook):
    """Times ``repeats`` windows of ``steps`` iterations after ``warmup`` iterations."""

    def __init__(self, warmup, steps, device):
        self.warmup, self.steps, self.device = warmup, steps, device
        self.times, self.start = [], None

    def before_train_iter(self, trainer):
        if trainer.iter >= self.warmup and (trainer.iter - self.warmup) % self.steps == 0:
            synchronize(self.device)
            now = time.perf_counter()
            if self.start is not None:
                self.times.append((now - self.start) / self.steps)
            self.start = now

    def after_run(self, trainer):
        synchronize(self.device)
        self.times.append((time.perf_counter() - self.start) / self.steps)


def plain(args, data, device, dtype):
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = MLP(args.width, args.depth).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == 'cuda' else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, pin_memory=device.type == 'cuda')
    context = autocast(device, dtype)
    total = args.warmup + args.steps * args.repeats
    times, start, step = [], None, 0
    while step < total:
        for x, label in loader:
            if step >= args.warmup and (step - args.warmup) % args.steps == 0:
                synchronize(device)
                now = time.perf_counter()
                if start is not None:
                    times.append((now - start) / args.steps)
                start = now
            if step == total:
                break
            x, label = x.to(device, non_blocking=True), label.to(device, non_blocking=True)
            with context():
                loss = ddp(x, label)['loss']
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
    synchronize(device)
    if len(times) < args.repeats:
        times.append((time.perf_counter() - start) / args.steps)
    return times


def hookloop_run(args, data, device, dtype, work_dir):
    torch.manual_seed(0)
    windows = Windows(args.warmup, args.steps, device)
    trainer = Trainer(model=MLP(args.width, args.depth), optimizer=dict(type='AdamW', lr=1e-4),
                      train_dataloader=DataLoader(data, batch_size=args.batch, shuffle=True,
                                                  pin_memory=device.type == 'cuda'),
                      max_iters=args.warmup + args.steps * args.repeats, device=str(device), strategy='ddp',
                      dist_backend=args.dist_backend, work_dir=work_dir, seed=0,
                      log_config=dict(interval=50), custom_hooks=[windows],
                      optimizer_config=dict(precision=PRECISION[args.dtype]))  # autocast (+ GradScaler for fp16)
    trainer.train()
    return trainer, windows.times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='bf16')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--dist-backend', default=None)
    parser.add_argument('--width', type=int, default=2048)
    parser.add_argument('--depth', type=int, default=8)
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    if 'RANK' not in os.environ:
        raise SystemExit('start with torchrun, e.g. torchrun --standalone --nproc-per-node 1 bench/ddp_gpu.py')
    dtype = DTYPES[args.dtype]
    samples = args.batch * 16
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, args.width, generator=generator),
                         torch.randint(0, 10, (samples,), generator=generator))
    with tempfile.TemporaryDirectory() as work_dir:
        # hookloop first: its Trainer joins the process group that the plain loop reuses.
        trainer, hookloop_times = hookloop_run(args, data, torch.device(args.device), dtype, work_dir)
        device = trainer.device
        plain_times = plain(args, data, device, dtype)
        hookloop_times_2 = hookloop_run(args, data, device, dtype, work_dir)[1]  # order effects
    hook_ms = 1000 * statistics.median(hookloop_times + hookloop_times_2)
    plain_ms = 1000 * statistics.median(plain_times)
    if trainer.rank == 0:
        print(json.dumps({'dtype': args.dtype, 'world_size': trainer.world_size,
                          'backend': torch_dist.get_backend(), 'device': str(device),
                          'gpu': torch.cuda.get_device_name(device) if device.type == 'cuda' else None,
                          'width': args.width, 'depth': args.depth, 'batch': args.batch,
                          'plain_ms_per_step': round(plain_ms, 3), 'hookloop_ms_per_step': round(hook_ms, 3),
                          'ratio': round(hook_ms / plain_ms, 4)}))
    trainer.close()


if __name__ == '__main__':
    main()
