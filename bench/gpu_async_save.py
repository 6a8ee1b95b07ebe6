"""Async checkpoints on CUDA: the loop's stall at a save point, synchronous vs ``async_save``,
for a model whose checkpoint is ``--size-mb`` (default 100 MB), over several saves in one process.

Checks (exit 1 otherwise): the async stall is at most ``--max-ratio`` (default 20%) of the
synchronous one; the async checkpoints equal the synchronous ones bit for bit; the staging
buffers are pinned CPU memory, allocated once and reused by every save. Prints one JSON line.

    PYTHONPATH=. python bench/gpu_async_save.py                 # needs a CUDA device
    PYTHONPATH=. python bench/gpu_async_save.py --device cpu    # the same checks on the CPU
"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_timing import time_stall  # noqa: E402

from hookloop.checkpoint.format import load_checkpoint  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--size-mb', type=int, default=100)
    parser.add_argument('--saves', type=int, default=5)
    parser.add_argument('--save-interval', type=int, default=2000)
    parser.add_argument('--max-ratio', type=float, default=0.2)
    args = parser.parse_args()
    if args.device == 'cuda' and not torch.cuda.is_available():
        sys.exit('bench/gpu_async_save.py needs a CUDA device (or --device cpu for the same checks on the CPU)')
    failures = []
    with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_DIR')) as directory:
        result = {'device': args.device, 'size_mb': args.size_mb, 'saves': args.saves}
        writers = {}
        for async_save in (False, True):
            stall, normal, extra, writer = time_stall(args.size_mb, args.device, args.saves, args.save_interval,
                                                      directory, async_save, return_writer=True)
            mode = 'async' if async_save else 'sync'
            result.update({f'{mode}_stall_ms': round(stall * 1e3, 2), f'{mode}_peak_extra_mb': round(extra / 2 ** 20, 1)})
            writers[mode] = writer
        result['normal_iteration_ms'] = round(normal * 1e3, 3)
        result['ratio'] = round(result['async_stall_ms'] / result['sync_stall_ms'], 4)
        if result['ratio'] > args.max_ratio:
            failures.append(f'async stall is {result["ratio"]:.1%} of the sync stall (> {args.max_ratio:.0%})')
        staging = writers['async']._staging
        if args.device == 'cuda' and not all(t.is_pinned() for t in staging.values()):
            failures.append('staging buffers are not pinned')
        if writers['async'].staging_allocations != len(staging):
            failures.append(f'{writers["async"].staging_allocations} staging allocations for {len(staging)} buffers: '
                            'not reused between saves')
        for name in sorted(n for n in os.listdir(os.path.join(directory, 'sync')) if n.endswith('.pth')):
            sync = load_checkpoint(os.path.join(directory, 'sync', name))['state_dict']
            background = load_checkpoint(os.path.join(directory, 'async', name))['state_dict']
            if any(not torch.equal(sync[k], background[k]) for k in sync):
                failures.append(f'{name}: async checkpoint differs from the synchronous one')
    print(json.dumps(result))
    for failure in failures:
        print('FAIL:', failure, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == '__main__':
    main()
