"""A user's seeded DataLoader keeps its order (issue 38 item 6): the loader hookloop rebuilds
around its resumable sampler draws each epoch's order as torch's ``RandomSampler`` would from
the loader's own ``generator`` (the DataLoader's iterator drawing its base seed from it first),
so a migrated script trains on the plain loop's batches, bitwise, and a resume continues them."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import Regressor, regression_data, train_and_close
from resume_helpers import StopAt
from hookloop import Trainer

EPOCHS = 3


def seeded_loader(seed=0, **kwargs):
    return DataLoader(regression_data(n=40), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed),
                      **kwargs)


def plain_loop(loader, epochs=EPOCHS):
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            model(x, y).backward()
            optimizer.step()
    return model.state_dict()


def hookloop_run(work_dir, loader, hooks=(), **kwargs):
    torch.manual_seed(0)
    model = Regressor()
    trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                      train_dataloader=loader, max_epochs=EPOCHS, work_dir=str(work_dir), seed=123, device='cpu',
                      log_level='WARNING', custom_hooks=list(hooks), **kwargs)
    return train_and_close(trainer)


def assert_bitwise(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_run_on_a_seeded_loader_equals_the_plain_loop_bitwise(tmp_path):
    """Before: hookloop reshuffled with its own seed (the peer benchmark's loss 0.01399, the plain loop's 0.01256)."""
    assert_bitwise(hookloop_run(tmp_path, seeded_loader()).model.state_dict(), plain_loop(seeded_loader()))


def test_a_resumed_run_on_a_seeded_loader_still_equals_the_plain_loop(tmp_path):
    stopped = hookloop_run(tmp_path, seeded_loader(), hooks=[StopAt(7)], checkpoint_config=dict(interval=1))
    assert stopped.iter == 8  # mid-epoch 2 of 5-batch epochs
    resumed = hookloop_run(tmp_path, seeded_loader(), resume_from='auto')
    assert resumed.iter == 15
    assert_bitwise(resumed.model.state_dict(), plain_loop(seeded_loader()))


def test_a_sampler_with_its_own_generator_is_followed_too(tmp_path):
    """RandomSampler(generator=g) and a loader without one: the order is the sampler's alone."""
    def loader():
        data = regression_data(n=40)
        return DataLoader(data, batch_size=8, sampler=torch.utils.data.RandomSampler(
            data, generator=torch.Generator().manual_seed(5)))
    assert_bitwise(hookloop_run(tmp_path, loader()).model.state_dict(), plain_loop(loader()))


def test_without_a_generator_the_order_is_hookloops_seeded_one(tmp_path):
    """No generator given: the order is a function of hookloop's seed and the epoch, as before."""
    from hookloop.data.resumable import epoch_order
    seen = []

    class Ids(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, index):
            seen.extend(index.tolist())
            return (self.w * index.float()).sum()

    loader = DataLoader(TensorDataset(torch.arange(12)), batch_size=4, shuffle=True)
    trainer = Trainer(Ids(), optimizer=dict(type='SGD', lr=0.0), train_dataloader=loader, max_epochs=2,
                      work_dir=str(tmp_path), seed=7, device='cpu', log_level='WARNING')
    train_and_close(trainer)
    assert seen == epoch_order(12, 7, 0, True) + epoch_order(12, 7, 1, True)


@pytest.mark.parametrize('persistent', [False, True])
def test_loader_workers_draw_the_same_order(tmp_path, persistent):
    """With workers (persistent or not: a persistent iterator draws its base seed once)."""
    kwargs = dict(num_workers=1, persistent_workers=persistent)
    assert_bitwise(hookloop_run(tmp_path, seeded_loader(**kwargs)).model.state_dict(), plain_loop(seeded_loader(**kwargs)))


def test_a_resume_with_a_differently_seeded_generator_is_told(tmp_path, capsys):
    hookloop_run(tmp_path, seeded_loader(), hooks=[StopAt(7)], checkpoint_config=dict(interval=1))
    capsys.readouterr()
    hookloop_run(tmp_path, seeded_loader(seed=1), resume_from='auto')
    assert "the epoch's samples are not those of the checkpointed run" in capsys.readouterr().out
