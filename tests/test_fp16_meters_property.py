"""A property test of fp16's meters across runs of one trainer (the ScaleBook, issue 26): random
loss-scale configurations, accumulation, overflow bursts and stops (each followed by another
``train()``, or a failing hook ending a run). Whatever the combination, the ``loss_scale`` and
``skipped_steps`` meters and the weights equal, bitwise, those of the per-step way (a device copy
at every step), and after every run the user's optimizer carries no step hook of hookloop's."""
import random

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import regression_data
from hookloop import Hook, Trainer
from test_fp16_meters import per_step_way

CASES = 40


class Bursty(nn.Module):
    """A regressor whose forwards listed in ``overflow`` (0-based, training only) overflow fp16."""

    def __init__(self, overflow):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.overflow, self.calls = overflow, 0

    def forward(self, x, y):
        if self.training:
            if self.calls in self.overflow:
                x = x * 1e30
            self.calls += 1
        return nn.functional.mse_loss(self.net(x).float(), y)


class StopAt(Hook):
    """Requests a stop after the iterations in ``stops`` (and raises after ``fail``, once)."""

    def __init__(self, stops, fail):
        self.stops, self.fail = set(stops), fail

    def after_train_iter(self, trainer):
        done = trainer.iter + 1
        if done == self.fail:
            self.fail = None
            raise RuntimeError('planted failure')
        if done in self.stops:
            trainer.request_stop('test')


def draw(rng):
    total = 10 * 3  # batch 4 over 40 samples, 3 epochs
    loss_scale = rng.choice([
        'dynamic',
        dict(init_scale=2. ** rng.randint(4, 20), growth_factor=rng.choice([2., 1.5]),
             backoff_factor=rng.choice([0.5, 0.25]), growth_interval=rng.randint(1, 4)),
        2. ** rng.randint(4, 12),  # static
    ])
    stops = sorted(rng.sample(range(1, total), rng.randint(0, 3)))
    return dict(loss_scale=loss_scale, cumulative_iters=rng.choice([1, 1, 2, 3]),
                overflow=set(rng.sample(range(total), rng.randint(0, 4))), stops=stops,
                fail=rng.choice([None, None, rng.randrange(1, total)]))


def run(work_dir, case):
    torch.manual_seed(0)
    model = Bursty(case['overflow'])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = Trainer(model, optimizer=optimizer, train_dataloader=DataLoader(regression_data(), batch_size=4),
                      max_epochs=3, work_dir=str(work_dir), seed=0, device='cpu', log_level='ERROR',
                      optimizer_config=dict(precision='fp16', loss_scale=case['loss_scale'],
                                            cumulative_iters=case['cumulative_iters']),
                      custom_hooks=[dict(type='FiniteLossGuard', max_skipped_steps=100),
                                    StopAt(case['stops'], case['fail'])])
    for _ in range(len(case['stops']) + 3):  # every stop, the failure, the end
        try:
            trainer.train()
        except RuntimeError as exc:
            assert 'planted failure' in str(exc)
        assert not optimizer._optimizer_step_post_hooks  # nothing of the run left on the user's object
        if trainer.iter >= trainer.max_iters:
            break
    assert trainer.iter == trainer.max_iters
    trainer.close()
    trainer.meters.keys()  # a read: the bulk series' values join the buffer
    meters = {key: [float(v) for v in trainer.meters._values[key]] for key in ('loss_scale', 'skipped_steps')}
    return meters, model.state_dict()


@pytest.mark.parametrize('seed', range(CASES))
def test_fp16_meters_across_runs_equal_the_per_step_way(tmp_path, monkeypatch, seed):
    case = draw(random.Random(seed))
    meters, weights = run(tmp_path / 'book', case)
    per_step_way(monkeypatch)
    want_meters, want_weights = run(tmp_path / 'per_step', case)
    assert meters == want_meters, case
    assert all(torch.equal(weights[k], want_weights[k]) for k in weights), case
