"""Train loaders without a length: IterableDatasets, generators, iterables of batches,
StatefulDataLoader and HF datasets — training, passes, resume, and bad input."""
import json
import os
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import hookloop
from hookloop import Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import CheckpointError, ConfigError, DataError


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.linear(x), y)


def sample(i):
    x = torch.tensor([float(i % 7), float(i % 5) / 5, 1.0])
    return x, x.sum(0, keepdim=True)


class CountingStream(IterableDataset):
    """``n`` samples in order, ``set_epoch`` recorded, every sample yielded counted."""

    def __init__(self, n):
        self.n, self.epochs, self.yielded = n, [], 0

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        for i in range(self.n):
            self.yielded += 1
            yield sample(i)


class StatefulStream(CountingStream):
    """A user's stream with the state protocol: it starts where ``load_state_dict`` says."""

    def __init__(self, n):
        super().__init__(n)
        self.position, self.start = 0, 0

    def state_dict(self):
        return {'position': self.position}

    def load_state_dict(self, state):
        self.start = state['position']

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, self.n):
            self.yielded += 1
            self.position = i + 1
            yield sample(i)


def make_trainer(tmp_path, loader, **kwargs):
    kwargs.setdefault('max_iters', 10)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader,
                   work_dir=str(tmp_path), seed=0, device='cpu', **kwargs)


def train(tmp_path, loader, **kwargs):
    trainer = make_trainer(tmp_path, loader, **kwargs)
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def plain_loop(batches, steps):
    """The same model and optimizer in a plain PyTorch loop, cycling ``batches``."""
    hookloop.seed_everything(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = list(batches)
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()
    return model.state_dict()


def reference_batches(n, batch_size):
    return list(DataLoader(CountingStream(n), batch_size=batch_size))


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_iterable_dataset_trains_with_max_iters_and_matches_a_plain_loop(tmp_path):
    hookloop.seed_everything(0)
    stream = CountingStream(12)  # 3 batches per pass; 10 iterations = 3 passes and one batch
    trainer = train(tmp_path, DataLoader(stream, batch_size=4), max_iters=10)
    assert trainer.iter == 10
    assert stream.epochs == [0, 1, 2, 3]  # set_epoch at every new pass
    assert_same_weights(trainer.model.state_dict(), plain_loop(reference_batches(12, 4), 10))


def test_iterable_dataset_in_an_epoch_run_is_refused_naming_the_way_out(tmp_path):
    with pytest.raises(ConfigError) as error:
        make_trainer(tmp_path, DataLoader(CountingStream(12), batch_size=4), max_iters=None, max_epochs=2)
    message = str(error.value)
    assert 'CountingStream' in message and 'max_iters' in message and 'iters_per_epoch' in message
    assert '\n' not in message
    assert not [name for name in os.listdir(tmp_path) if name.endswith('.pth')]


def test_iters_per_epoch_makes_epochs_of_a_stream_that_continues_across_them(tmp_path):
    hookloop.seed_everything(0)
    stream = CountingStream(12)
    epochs = []

    class RecordEpochs(hookloop.Hook):
        def after_train_epoch(self, trainer):
            epochs.append((trainer.epoch, trainer.inner_iter))

    trainer = make_trainer(tmp_path, DataLoader(stream, batch_size=4), max_iters=None, max_epochs=3,
                           iters_per_epoch=2)
    trainer.register_hook(RecordEpochs())
    trainer.train()
    trainer.close()
    assert trainer.iter == 6 and epochs == [(0, 2), (1, 2), (2, 2)]
    assert stream.yielded == 24  # two passes of 12: epochs did not restart the stream
    assert_same_weights(trainer.model.state_dict(), plain_loop(reference_batches(12, 4), 6))


def test_a_generator_and_a_list_of_batches_train(tmp_path):
    batches = reference_batches(8, 4)
    hookloop.seed_everything(0)
    from_list = train(tmp_path / 'list', batches, max_iters=5)
    assert_same_weights(from_list.model.state_dict(), plain_loop(batches, 5))
    hookloop.seed_everything(0)
    from_generator = train(tmp_path / 'generator', (b for b in batches), max_iters=2)
    assert from_generator.iter == 2


def test_a_spent_generator_says_so_instead_of_hanging(tmp_path):
    batches = reference_batches(8, 4)
    with pytest.raises(DataError, match='yielded no batch in pass 1.*read only once'):
        train(tmp_path, iter(batches), max_iters=5)


def test_empty_stream_in_a_max_iters_run_says_it_is_empty(tmp_path):
    with pytest.raises(DataError) as error:
        train(tmp_path, DataLoader(CountingStream(0), batch_size=4), max_iters=5)
    assert 'CountingStream' in str(error.value) and 'empty' in str(error.value)
    assert not [name for name in os.listdir(tmp_path) if name.endswith('.pth')]


def test_empty_map_style_loader_is_refused(tmp_path):
    with pytest.raises(DataError, match='empty'):
        make_trainer(tmp_path, DataLoader(list(range(3)), batch_size=4, drop_last=True))


class Broken(CountingStream):
    def __iter__(self):
        for i in range(self.n):
            if i == 9:
                raise ValueError('corrupt record 9')
            yield sample(i)


@pytest.mark.parametrize('num_workers', [0, 1])
def test_a_dataset_raising_in_iter_is_named_with_the_batch_index(tmp_path, num_workers):
    loader = DataLoader(Broken(20), batch_size=4, num_workers=num_workers)
    with pytest.raises(DataError) as error:
        train(tmp_path, loader, max_iters=5)
    message = str(error.value)
    assert 'Broken' in message and 'batch 2 of pass 0' in message and 'corrupt record 9' in message
    assert '\n' not in message
    assert not [name for name in os.listdir(tmp_path) if name.endswith('.pth')]


def test_map_style_dataset_without_len_in_a_dataloader_is_a_config_error(tmp_path):
    class NoLength(torch.utils.data.Dataset):
        def __getitem__(self, index):
            return sample(index)

    with pytest.raises(ConfigError, match='NoLength.*without __len__'):
        make_trainer(tmp_path, DataLoader(NoLength(), batch_size=2))


def checkpoint_every_iter():
    return dict(interval=1, by_epoch=False)


def resume_and_finish(tmp_path, make_loader, max_iters, stop_at):
    """Train to ``stop_at`` (saving each iteration), resume in a fresh trainer, finish."""
    hookloop.seed_everything(0)
    first = make_trainer(tmp_path, make_loader(), max_iters=stop_at, checkpoint_config=checkpoint_every_iter())
    first.train()
    first.close()
    hookloop.seed_everything(0)
    loader = make_loader()
    resumed = make_trainer(tmp_path, loader, max_iters=max_iters, checkpoint_config=checkpoint_every_iter(),
                           auto_resume=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        resumed.train()
    resumed.close()
    return resumed, loader, [str(w.message) for w in caught]


def test_stateless_stream_resumes_by_fast_forward_with_a_warning_and_the_same_weights(tmp_path):
    resumed, loader, warned = resume_and_finish(tmp_path, lambda: DataLoader(CountingStream(12), batch_size=4),
                                                max_iters=8, stop_at=5)
    assert any('reading and dropping the first 2 batches of pass 1' in w for w in warned), warned
    # Resumed at pass 1, batch 2: it re-reads pass 1's first two batches, then reads 1 + 2 batches.
    assert loader.dataset.yielded == 8 + 4 + 8
    assert_same_weights(resumed.model.state_dict(), plain_loop(reference_batches(12, 4), 8))


def test_stateful_user_stream_resumes_through_its_state_reading_nothing_twice(tmp_path):
    resumed, loader, warned = resume_and_finish(tmp_path, lambda: DataLoader(StatefulStream(12), batch_size=4),
                                                max_iters=8, stop_at=5)
    assert not any('dropping' in w for w in warned), warned
    # Resumed at pass 1, batch 2: it reads pass 1's last batch, then pass 2's first two.
    assert loader.dataset.yielded == 4 + 8
    assert_same_weights(resumed.model.state_dict(), plain_loop(reference_batches(12, 4), 8))
    data = load_checkpoint(read_pointer(str(tmp_path)))['data']
    assert data['way'] == 'state' and data['pass'] == 2 and data['batches_in_pass'] == 2


@pytest.mark.parametrize('stop_at', [4, 5])  # at the end of the first pass, and inside the second
def test_stateful_dataloader_over_shuffled_map_style_data_resumes_exactly(tmp_path, stop_at):
    from torchdata.stateful_dataloader import StatefulDataLoader
    data = [sample(i) for i in range(10)]

    def make_loader():
        # No generator=: torchdata draws the worker base seed from the loader's generator too,
        # so a shared one reshuffles differently after a restore (docs/data.md).
        return StatefulDataLoader(data, batch_size=3, shuffle=True)

    resumed, _, warned = resume_and_finish(tmp_path / 'resumed', make_loader, max_iters=9, stop_at=stop_at)
    assert not any('dropping' in w for w in warned), warned
    hookloop.seed_everything(0)
    straight = train(tmp_path / 'straight', make_loader(), max_iters=9)
    assert_same_weights(resumed.model.state_dict(), straight.model.state_dict())


def write_json_lines(path, n):
    with open(path, 'w') as f:
        for i in range(n):
            f.write(json.dumps({'x': [float(i % 7), float(i % 5) / 5, 1.0], 'id': i}) + '\n')
    return str(path)


class XYModel(Regressor):
    def forward(self, x, id):
        return nn.functional.mse_loss(self.linear(x), x.sum(1, keepdim=True))


def test_hf_map_style_dataset_uses_hookloops_resumable_sampler(tmp_path):
    datasets = pytest.importorskip('datasets')
    from hookloop.data.resumable import ResumableBatchSampler
    rows = {'x': [[float(i), 1.0, 0.5] for i in range(10)], 'id': list(range(10))}
    dataset = datasets.Dataset.from_dict(rows).with_format('torch')
    trainer = Trainer(XYModel(), optimizer=dict(type='SGD', lr=0.01),
                      train_dataloader=dict(dataset=dataset, batch_size=4, shuffle=True), max_epochs=1,
                      work_dir=str(tmp_path), seed=0, device='cpu')
    assert isinstance(trainer.train_dataloader.batch_sampler, ResumableBatchSampler)
    batch = next(iter(trainer.train_dataloader))
    assert batch['x'].dtype == torch.float32 and batch['x'].shape == (4, 3)
    trainer.train()
    trainer.close()


@pytest.mark.parametrize('num_workers', [0, 2])
def test_hf_streaming_config_trains_and_resumes_through_its_state(tmp_path, num_workers):
    pytest.importorskip('datasets')
    files = [write_json_lines(tmp_path / 'a.jsonl', 4), write_json_lines(tmp_path / 'b.jsonl', 6)]

    def loader_cfg():  # 2 shards: with 2 workers each reads one (torchdata keeps both workers' states)
        return dict(dataset=dict(type='HFDataset', path='json', data_files=files, split='train', streaming=True),
                    batch_size=2, num_workers=num_workers)

    def run(work_dir, max_iters, **kwargs):
        hookloop.seed_everything(0)
        trainer = Trainer(XYModel(), optimizer=dict(type='SGD', lr=0.01), train_dataloader=loader_cfg(),
                          max_iters=max_iters, work_dir=str(work_dir), seed=0, device='cpu',
                          checkpoint_config=checkpoint_every_iter(), **kwargs)
        trainer.train()
        trainer.close()
        return trainer

    run(tmp_path / 'run', 7)  # 5 batches a pass
    saved = load_checkpoint(read_pointer(str(tmp_path / 'run')))['data']
    assert saved['way'] == 'state' and saved['pass'] == 1 and saved['batches_in_pass'] == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        resumed = run(tmp_path / 'run', 13, auto_resume=True)
    assert not [w for w in caught if 'dropping' in str(w.message)]  # restored, not fast-forwarded
    straight = run(tmp_path / 'straight', 13)
    assert_same_weights(resumed.model.state_dict(), straight.model.state_dict())


def test_a_stream_state_that_does_not_fit_is_a_checkpoint_error(tmp_path):
    pytest.importorskip('datasets')
    files = write_json_lines(tmp_path / 'a.jsonl', 6)
    extra = write_json_lines(tmp_path / 'b.jsonl', 6)

    def run(data_files, max_iters, **kwargs):
        trainer = Trainer(XYModel(), optimizer=dict(type='SGD', lr=0.01), max_iters=max_iters,
                          train_dataloader=dict(dataset=dict(type='HFDataset', path='json', data_files=data_files,
                                                             split='train', streaming=True), batch_size=4),
                          work_dir=str(tmp_path / 'run'), seed=0, device='cpu',
                          checkpoint_config=checkpoint_every_iter(), **kwargs)
        try:
            trainer.train()
        finally:
            trainer.close()

    run([files, extra], 2)  # saved while reading the second file
    with pytest.raises(CheckpointError) as error:
        run([files], 4, auto_resume=True)
    assert 'cannot be restored' in str(error.value) and '\n' not in str(error.value)
    assert load_checkpoint(read_pointer(str(tmp_path / 'run')))['meta']['iter'] == 2  # nothing new written


def test_seed_everything_is_exported_and_makes_models_repeat():
    hookloop.seed_everything(3)
    a = Regressor().state_dict()
    hookloop.seed_everything(3)
    assert_same_weights(a, Regressor().state_dict())
    assert 'seed_everything' in hookloop.__all__
