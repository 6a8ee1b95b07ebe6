"""Device prefetch: used on CUDA only (one batch ahead on a side stream), never on the CPU or
for loaders that checkpoint their own position; results equal the unprefetched run."""
import pytest
import torch
from torch.utils.data import DataLoader

import hookloop.engine.run_length as trainer_module  # where the train stream gets its DevicePrefetcher
from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Trainer
from hookloop.data.prefetch import DevicePrefetcher, uses_prefetch


class StatefulLoader(DataLoader):
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def make_trainer(work_dir, device='cpu', **kwargs):
    torch.manual_seed(0)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), max_epochs=2, work_dir=work_dir, seed=0,
                   train_dataloader=DataLoader(regression_data(), batch_size=8, shuffle=True), device=device,
                   log_config=dict(interval=100), **kwargs)


def test_cpu_runs_are_not_prefetched(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(trainer_module, 'DevicePrefetcher', lambda *args: made.append(args) or args[0])
    train(make_trainer(tmp_path))
    assert made == [] and not uses_prefetch('cpu', DataLoader(regression_data()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_stateful_loaders_are_not_prefetched_on_cuda():
    assert uses_prefetch('cuda', DataLoader(regression_data()))
    assert not uses_prefetch('cuda', StatefulLoader(regression_data()))
    assert not uses_prefetch('cuda', DataLoader(regression_data()), enabled=False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_cuda_prefetch_gives_the_same_weights(tmp_path, monkeypatch):
    made = []
    original = trainer_module.DevicePrefetcher
    monkeypatch.setattr(trainer_module, 'DevicePrefetcher', lambda *args: made.append(1) or original(*args))
    prefetched = train(make_trainer(tmp_path / 'a', device='cuda'))
    plain = train(make_trainer(tmp_path / 'b', device='cuda', device_prefetch=False))
    assert len(made) == 2  # one per epoch
    for key, value in plain.model.state_dict().items():
        assert torch.equal(prefetched.model.state_dict()[key], value), key
    batches = list(DevicePrefetcher(iter([(torch.ones(2), torch.zeros(2))] * 3), 'cuda'))
    assert len(batches) == 3 and all(t.is_cuda for b in batches for t in b)
