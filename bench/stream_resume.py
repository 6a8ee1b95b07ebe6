"""Resume time at the middle of a 100 000-sample stream: through the loader's state_dict
(exact, reads nothing twice) versus fast-forward (reads and drops the first half again).

The stream is an HF streaming dataset over a local JSON-lines file, read by torchdata's
StatefulDataLoader; the fast-forward case reads the same data through a stream without
state. What is timed is what a resumed run waits for before its first batch: the
position restored and that batch loaded (hookloop's ``TrainStream``).

    python bench/stream_resume.py [--samples 100000] [--batch-size 32]
"""
import argparse
import json
import os
import tempfile
import time
import warnings

import torch
from torch.utils.data import IterableDataset

from hookloop.data.train_stream import TrainStream


class Stateless(IterableDataset):
    """The same examples with no state_dict: a resume must fast-forward."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def write_data(path, samples):
    with open(path, 'w') as f:
        for index in range(samples):
            f.write(json.dumps({'x': [float(index % 13), float(index % 7), 1.0], 'id': index}) + '\n')


def hf_stream(path):
    import datasets
    return datasets.load_dataset('json', data_files=path, split='train', streaming=True).with_format('torch')


def loader_over(dataset, batch_size):
    from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader(dataset, batch_size=batch_size)


def saved_at_middle(make_loader, batches):
    """A stream read to ``batches`` and its checkpoint entry; the seconds that reading took."""
    stream = TrainStream(make_loader(), seed=0, per_epoch=False)
    begin = time.perf_counter()
    for _ in range(batches):
        stream.next_batch()
    return stream.state_dict(), time.perf_counter() - begin


def resume_seconds(make_loader, state):
    stream = TrainStream(make_loader(), seed=0, per_epoch=False)
    stream.load_state_dict(state, epoch=0, inner_iter=0)
    begin = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        batch = stream.next_batch()
    seconds = time.perf_counter() - begin
    return seconds, int(batch['id'][0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--samples', type=int, default=100_000)
    parser.add_argument('--batch-size', type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    middle = args.samples // args.batch_size // 2
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, 'data.jsonl')
        write_data(path, args.samples)
        cases = {'state_dict (StatefulDataLoader + HF state)': lambda: loader_over(hf_stream(path), args.batch_size),
                 'fast-forward (same data, no state)': lambda: loader_over(Stateless(hf_stream(path)), args.batch_size)}
        print(f'{args.samples} samples, batch {args.batch_size}, resume at batch {middle} '
              f'(sample {middle * args.batch_size})')
        for name, make_loader in cases.items():
            state, read_seconds = saved_at_middle(make_loader, middle)
            seconds, first_id = resume_seconds(make_loader, state)
            assert first_id == middle * args.batch_size, (name, first_id)
            print(f'{name:45s} resume {seconds * 1000:9.1f} ms   (reading the first half took {read_seconds:.2f} s; '
                  f'way={state["way"]})')


if __name__ == '__main__':
    main()
