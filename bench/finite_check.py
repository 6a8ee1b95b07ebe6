"""The cost of the finite-state check per save (hookloop/checkpoint/finite_state.py): a ~100 MB model
(25 M float32 parameters in 50 tensors) with SGD momentum (another 100 MB of optimizer state),
median of 5. ``--device cuda`` measures it on a GPU (one sync per save).

    PYTHONPATH=. python bench/finite_check.py [--device cuda]
"""
import argparse
import statistics
import time

import torch

from hookloop.checkpoint.finite_state import check_finite_state


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    model = torch.nn.Sequential(*[torch.nn.Linear(707, 707) for _ in range(50)]).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 707, device=args.device)).sum().backward()
    optimizer.step()
    checkpoint = {'state_dict': model.state_dict(), 'optimizer': optimizer.state_dict(), 'meta': {'iter': 1}}
    megabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    times = []
    for _ in range(6):
        if args.device != 'cpu':
            torch.cuda.synchronize()
        start = time.perf_counter()
        check_finite_state(checkpoint, 'x.pth')
        times.append(time.perf_counter() - start)
    print(f'{args.device}: model {megabytes:.0f} MB (+ as much optimizer state): finite check per save '
          f'{statistics.median(times[1:]) * 1e3:.1f} ms (median of 5)')


if __name__ == '__main__':
    main()
