"""Helpers for the schedule tests: a trainer with two parameter groups and a hook that
records the learning rate and momentum each iteration actually uses."""
import torch

from hookloop import DATASETS, MODELS, Hook, Priority, Trainer
from conftest import Regressor, regression_data

# For configs in files (plot-lr): ``custom_imports = ['schedule_recording']`` registers these.
MODELS.register_module(module=Regressor, module_name='ScheduleTestRegressor', force=True)
DATASETS.register_module(module=regression_data, module_name='ScheduleTestData', force=True)

ITERS_PER_EPOCH = 5  # 40 samples, batch 8
LRS = (0.01, 0.002)  # the two groups' initial learning rates
SGD_MOMENTA = (0.9, 0.8)
ADAM_BETAS = ((0.9, 0.999), (0.8, 0.99))


class Recorder(Hook):
    """Runs last in before_train_iter, after the LR / momentum hooks: what it sees is
    what the optimizer step of this iteration uses (nothing changes them in between)."""

    PRIORITY = Priority.LOWEST

    def __init__(self):
        self.lrs, self.momenta, self.beta2 = [], [], []

    def before_train_iter(self, trainer):
        groups = trainer.optimizer.param_groups
        self.lrs.append([g['lr'] for g in groups])
        self.momenta.append([g['momentum'] if 'momentum' in g else g['betas'][0] for g in groups])
        self.beta2.append([g['betas'][1] for g in groups if 'betas' in g])


def two_group_optimizer(model, kind='SGD'):
    first, second = model.net[0].parameters(), model.net[2].parameters()
    if kind == 'SGD':
        return torch.optim.SGD([dict(params=first, lr=LRS[0], momentum=SGD_MOMENTA[0]),
                                dict(params=second, lr=LRS[1], momentum=SGD_MOMENTA[1])])
    if kind == 'Adam':
        return torch.optim.Adam([dict(params=first, lr=LRS[0], betas=ADAM_BETAS[0]),
                                 dict(params=second, lr=LRS[1], betas=ADAM_BETAS[1])])
    raise ValueError(kind)


def make_trainer(tmp_path, optimizer='SGD', max_epochs=None, max_iters=None, **kwargs):
    torch.manual_seed(0)
    model = Regressor()
    loader = torch.utils.data.DataLoader(regression_data(), batch_size=8)
    if max_epochs is None and max_iters is None:
        max_epochs = 6
    return Trainer(model, optimizer=two_group_optimizer(model, optimizer), train_dataloader=loader,
                   max_epochs=max_epochs, max_iters=max_iters, work_dir=tmp_path, seed=0, device='cpu',
                   log_level='WARNING', **kwargs)


def record(tmp_path, optimizer='SGD', max_epochs=None, max_iters=None, **kwargs):
    """Train with the given hook configs; the recorder with everything it saw."""
    trainer = make_trainer(tmp_path, optimizer, max_epochs, max_iters, **kwargs)
    recorder = trainer.register_hook(Recorder())
    trainer.train()
    trainer.close()
    return recorder


def assert_sequence(actual, expected, rel=1e-9):
    assert len(actual) == len(expected)
    for i, (got, want) in enumerate(zip(actual, expected)):
        for g, (a, b) in enumerate(zip(got, want)):
            assert abs(a - b) <= rel * abs(b) + 1e-15, f'iteration {i}, group {g}: applied {a!r}, expected {b!r}'
