"""Checkpoint timings: save and load of a 100 MB model, the training loop's stall at a save
point with synchronous and asynchronous (``async_save=True``) saves, and the time to resume in
the middle of a 10,000-batch epoch versus at its start.

    PYTHONPATH=. python bench/checkpoint_timing.py [--repeats 3] [--device cpu|cuda] [--saves 5]
    PYTHONPATH=. python bench/checkpoint_timing.py --integrity 10,100,1000 [--repeats 5]

``--integrity SIZES`` prints only the integrity table: for checkpoints of SIZES MB (8 tensors),
hookloop's save (temporary file, checksum, fsync, rename) against ``torch.save`` + fsync,
and the verified load (``load_checkpoint``) against ``torch.load(weights_only=True)``, each
the median of ``--repeats`` interleaved runs (the file stays in the page cache: the figures are
the CPU's work, not the disk's).

Prints a table (median of ``--repeats`` runs). The stall is how much longer an iteration with
a save point takes than a normal one (median over ``--saves`` saves in one process, the
last save left out: the run waits for it at the end); peak extra memory is the largest rise
of the process's resident memory during the run over its value at the start. The resume time is measured from
``trainer.train()`` to the first ``before_train_iter``: loading the checkpoint, restoring
every state, starting the sampler at the saved position and fetching the first batch. For
comparison it also times what a trainer without a resumable sampler does (ModelScope's way):
fetch and drop the batches already done.
"""
import argparse
import os
import statistics
import tempfile
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookloop import Hook, Trainer
from hookloop.checkpoint.format import load_checkpoint, save_checkpoint


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


def time_integrity(size_mb, repeats, directory):
    """Median seconds of (hookloop save, torch.save + fsync, verified load, torch.load)."""
    try:
        from hookloop.fileio.hashing import default_algorithm
    except ImportError:  # before issue 26: SHA-256, in a separate read
        default_algorithm = lambda: 'sha256'  # noqa: E731
    generator = torch.Generator().manual_seed(0)
    state = {'meta': {'iter': 0}, 'state_dict': {f'layer{i}.weight': torch.randn(size_mb * 2 ** 15, generator=generator)
                                                 for i in range(8)}}  # 8 x size_mb / 8 MB of float32
    path, plain_path = os.path.join(directory, 'integrity.pth'), os.path.join(directory, 'plain.pth')
    times = {'save': [], 'torch_save': [], 'load': [], 'torch_load': []}
    for _ in range(repeats):
        start = time.perf_counter()
        save_checkpoint(state, path)
        times['save'].append(time.perf_counter() - start)
        start = time.perf_counter()
        with open(plain_path, 'wb') as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        times['torch_save'].append(time.perf_counter() - start)
        start = time.perf_counter()
        load_checkpoint(path)
        times['load'].append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.load(plain_path, weights_only=True)
        times['torch_load'].append(time.perf_counter() - start)
    algorithm = default_algorithm()
    os.remove(plain_path)
    return os.path.getsize(path) / 2 ** 20, algorithm, {k: statistics.median(v) for k, v in times.items()}


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


class BigModel(nn.Module):
    """A tiny trainable part (cheap iterations) and ``size_mb`` of frozen weights in a buffer,
    so a checkpoint is large while an iteration stays short and the stall stands out."""

    def __init__(self, size_mb):
        super().__init__()
        self.fc = nn.Linear(16, 1)
        self.register_buffer('frozen', torch.randn(size_mb * 2 ** 18))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.fc(x.remainder(10.0) * 0.1), y)  # bounded inputs: a finite loss


class Stamps(Hook):
    """The time at the end of each iteration (after the checkpoint hook has run)."""

    def __init__(self):
        self.times = []

    def after_train_iter(self, trainer):
        self.times.append(time.perf_counter())


def resident_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


class PeakMemory:
    """Samples the resident memory every millisecond on a thread; ``extra`` is the peak over
    the value when sampling started."""

    def __enter__(self):
        self.start = self.peak = resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.extra = self.peak - self.start


def time_stall(size_mb, device, saves, interval, directory, async_save, return_writer=False):
    """(median stall s, median normal iteration s, peak extra memory bytes, staging buffers or,
    with ``return_writer``, the trainer's background writer)."""
    torch.manual_seed(0)
    stamps = Stamps()
    loader = DataLoader(Tokens(interval * saves * 8), batch_size=8)
    work_dir = os.path.join(directory, 'async' if async_save else 'sync')
    trainer = Trainer(BigModel(size_mb), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader,
                      max_epochs=1, work_dir=work_dir, seed=0, device=device, log_level='WARNING',
                      log_config=dict(interval=10 ** 9), custom_hooks=[stamps],
                      checkpoint_config=dict(interval=interval, by_epoch=False, max_keep_ckpts=-1,
                                             async_save=async_save))
    with PeakMemory() as memory:
        trainer.train()
    trainer.close()
    gaps = [b - a for a, b in zip(stamps.times, stamps.times[1:])]  # gaps[i]: iteration i + 2
    save_gaps = [gaps[i] for i in range(len(gaps)) if (i + 2) % interval == 0 and i + 2 < len(stamps.times)]
    normal = [gaps[i] for i in range(len(gaps)) if (i + 2) % interval not in (0, 1)]
    writer = trainer.checkpointer.async_writer
    buffers = writer if return_writer else (len(writer._staging) if writer is not None else 0)
    return statistics.median(save_gaps) - statistics.median(normal), statistics.median(normal), memory.extra, buffers


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
    parser.add_argument('--saves', type=int, default=5, help='saves per run for the stall figures')
    parser.add_argument('--save-interval', type=int, default=2000,
                        help='iterations between saves (training between saves must outlast a write)')
    parser.add_argument('--stall-only', action='store_true', help='only the sync vs async stall figures')
    parser.add_argument('--integrity', default='', help='comma-separated sizes in MB: only the integrity table')
    args = parser.parse_args()
    if args.integrity:
        print(f'load average {os.getloadavg()[0]:.1f}; median of {args.repeats}')
        print(f'{"MB":>6} {"hash":>6} {"save s":>8} {"torch.save+fsync":>16} {"ratio":>6} '
              f'{"verified load s":>15} {"torch.load":>10} {"ratio":>6}')
        for size in map(int, args.integrity.split(',')):
            with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_DIR')) as directory:
                mb, algorithm, t = time_integrity(size, args.repeats, directory)
            print(f'{mb:6.0f} {algorithm:>6} {t["save"]:8.3f} {t["torch_save"]:16.3f} {t["save"] / t["torch_save"]:6.2f} '
                  f'{t["load"]:15.3f} {t["torch_load"]:10.3f} {t["load"] / t["torch_load"]:6.2f}', flush=True)
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_DIR')) as directory:
        stalls = {}
        for async_save in (False, True):
            stall, normal, extra, buffers = time_stall(args.size_mb, args.device, args.saves, args.save_interval,
                                                       directory, async_save)
            stalls[async_save] = stall
            print(f'{"async" if async_save else "sync ":>5} saves of a {args.size_mb} MB model ({args.device}, '
                  f'{args.saves} saves): stall {stall * 1e3:8.1f} ms per save (normal iteration '
                  f'{normal * 1e3:.2f} ms), peak extra memory {extra / 2 ** 20:6.1f} MB'
                  + (f', {buffers} staging buffers reused by every save' if async_save else ''))
        print(f'async stall / sync stall: {stalls[True] / stalls[False]:.1%}')
        if args.stall_only:
            return
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
