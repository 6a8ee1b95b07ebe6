"""The loop: counters at every stage, epoch- and iteration-based runs, the model step contract."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookloop import TRAINERS, ConfigError, Hook, Trainer, build_trainer
from conftest import Regressor, regression_data


class CounterLog(Hook):
    def __init__(self):
        self.seen = []

    def _note(self, stage, trainer):
        self.seen.append((stage, trainer.epoch, trainer.iter, trainer.inner_iter))

    def before_run(self, trainer):
        self._note('before_run', trainer)

    def before_train_epoch(self, trainer):
        self._note('before_train_epoch', trainer)

    def before_train_iter(self, trainer):
        self._note('before_train_iter', trainer)

    def after_train_iter(self, trainer):
        self._note('after_train_iter', trainer)
        assert self.every_n_iters(trainer, 1) and self.every_n_inner_iters(trainer, 1)

    def after_train_epoch(self, trainer):
        self._note('after_train_epoch', trainer)

    def after_run(self, trainer):
        self._note('after_run', trainer)


def trainer_for(tmp_path, n=12, batch_size=4, **kwargs):
    loader = DataLoader(regression_data(n=n), batch_size=batch_size)
    kwargs.setdefault('optimizer', dict(type='SGD', lr=0.01))
    return Trainer(Regressor(), train_dataloader=loader, work_dir=tmp_path, seed=0, device='cpu',
                   log_level='WARNING', **kwargs)


def test_counters_at_every_stage_epoch_based(tmp_path):
    trainer = trainer_for(tmp_path, max_epochs=2)  # 3 iterations per epoch
    log = trainer.register_hook(CounterLog())
    trainer.train()
    expected = [('before_run', 0, 0, 0)]
    for epoch in range(2):
        expected.append(('before_train_epoch', epoch, 3 * epoch, 0))
        for i in range(3):
            expected += [('before_train_iter', epoch, 3 * epoch + i, i), ('after_train_iter', epoch, 3 * epoch + i, i)]
        expected.append(('after_train_epoch', epoch, 3 * epoch + 3, 3))
    expected.append(('after_run', 2, 6, 0))
    assert log.seen == expected
    assert (trainer.max_iters, trainer.iters_per_epoch) == (6, 3)


def test_iteration_based_run_cycles_the_loader(tmp_path):
    trainer = trainer_for(tmp_path, max_iters=7)  # 3 per epoch: 3 + 3 + 1
    log = trainer.register_hook(CounterLog())
    trainer.train()
    iters = [(e, i, inner) for s, e, i, inner in log.seen if s == 'after_train_iter']
    assert iters == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 3, 0), (1, 4, 1), (1, 5, 2), (2, 6, 0)]
    assert trainer.iter == 7 and trainer.max_epochs == 3


def test_helpers_end_of_epoch_and_last(tmp_path):
    flags = []

    class Flags(Hook):
        def after_train_iter(self, trainer):
            flags.append((self.end_of_epoch(trainer), self.is_last_iter(trainer), self.is_last_epoch(trainer),
                          self.every_n_iters(trainer, 2), self.every_n_inner_iters(trainer, 2)))

        def after_train_epoch(self, trainer):
            flags.append(('epoch', self.every_n_epochs(trainer, 2)))
    trainer = trainer_for(tmp_path, max_iters=5)  # epochs of 3 and 2
    trainer.register_hook(Flags())
    trainer.train()
    assert flags == [(False, False, False, False, False), (False, False, False, True, True),
                     (True, False, False, False, False), ('epoch', False),
                     (False, False, True, True, False), (True, True, True, False, True), ('epoch', True)]


class Contract(nn.Module):
    """Returns each output form the contract allows, chosen by ``kind``."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(2))
        self.calls = []

    def forward(self, *args, **kwargs):
        self.calls.append((len(args), sorted(kwargs)))
        x = kwargs['x'] if kwargs else args[0]
        loss = (x @ self.weight).pow(2).mean()
        if self.kind == 'tensor':
            return loss
        if self.kind == 'dict':
            return {'loss': loss, 'loss_aux': loss.detach() * 0, 'logits': x}
        if self.kind == 'attr':
            return SimpleNamespace(loss=loss, logits=x)
        if self.kind == 'tuple':
            return x, x
        return x * self.weight  # plain output for loss_fn


class DictData(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {'x': torch.full((2,), float(i))}


class TupleData(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i)), torch.tensor(0.0)


class TensorData(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i))


@pytest.mark.parametrize('data,call', [(DictData, (0, ['x'])), (TupleData, (2, [])), (TensorData, (1, []))])
@pytest.mark.parametrize('kind', ['tensor', 'dict', 'attr', 'plain'])
def test_model_step_contract(tmp_path, data, call, kind):
    model = Contract(kind)
    loss_fn = (lambda outputs, batch: {'loss': outputs.pow(2).mean()}) if kind == 'plain' else None
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.01), train_dataloader=dict(dataset=data(), batch_size=2),
                      max_iters=2, work_dir=tmp_path, seed=0, device='cpu', loss_fn=loss_fn, log_level='WARNING')
    before = model.weight.detach().clone()
    trainer.train()
    assert model.calls == [call, call]
    assert 'loss' in trainer.outputs and trainer.train_outputs is trainer.outputs
    assert not torch.equal(before, model.weight)  # the loss reached the weights
    if kind == 'dict':
        assert trainer.outputs['logits'].shape == (2, 2)


def test_model_without_loss_gets_clear_error(tmp_path):
    trainer = Trainer(Contract('tuple'), optimizer=dict(type='SGD', lr=0.01),
                      train_dataloader=dict(dataset=TensorData(), batch_size=2), max_iters=1, work_dir=tmp_path,
                      seed=0, device='cpu', log_level='WARNING')
    with pytest.raises(ConfigError, match='pass loss_fn'):
        trainer.train()


def test_validation_loop_and_accuracy_evaluator(tmp_path):
    class Classifier(nn.Module):
        def forward(self, x, y):
            return {'logits': torch.stack([x, -x], dim=1), 'loss': x.sum() * 0}
    data = [(torch.tensor(float(v)), torch.tensor(0 if v > 0 else 1)) for v in (1, 2, -1, 3)]
    data[3] = (torch.tensor(3.0), torch.tensor(1))  # one wrong
    trainer = Trainer(Classifier(), val_dataloader=dict(dataset=data, batch_size=3), val_evaluator=dict(type='Accuracy'),
                      work_dir=tmp_path, device='cpu', seed=0, log_level='WARNING')
    assert trainer.val() == {'accuracy': 75.0}
    assert trainer.metrics == {'accuracy': 75.0}


def test_function_evaluator_is_sample_weighted(tmp_path):
    class Echo(nn.Module):
        def forward(self, x):
            return x
    data = [torch.tensor(float(i)) for i in range(5)]
    trainer = Trainer(Echo(), val_dataloader=dict(dataset=data, batch_size=2), work_dir=tmp_path, device='cpu', seed=0,
                      val_evaluator=lambda outputs, batch: {'mean': outputs.float().mean()}, log_level='WARNING')
    assert trainer.val() == {'mean': pytest.approx(2.0)}


def test_build_trainer_default_and_registered_subclass(tmp_path):
    args = dict(model=Regressor(), optimizer=dict(type='SGD', lr=0.01),
                train_dataloader=DataLoader(regression_data(n=8), batch_size=4), max_iters=2, work_dir=tmp_path,
                seed=0, device='cpu', log_level='WARNING')
    assert type(build_trainer(name='default', default_args=args)) is Trainer

    @TRAINERS.register_module(module_name='my_trainer', force=True)
    class MyTrainer(Trainer):
        pass
    assert type(build_trainer('my_trainer', default_args=args)) is MyTrainer


class CountingData(Dataset):
    def __init__(self, n):
        self.n, self.fetched = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.fetched.append(i)
        return torch.full((4,), float(i)), torch.tensor([float(i)])


def test_resume_mid_epoch_loads_no_skipped_batch_and_matches(tmp_path):
    def run(stop_after=None, resume=None, data=None):
        torch.manual_seed(0)
        data = data or CountingData(24)
        trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                          train_dataloader=DataLoader(data, batch_size=4, shuffle=True), max_epochs=2,
                          work_dir=tmp_path, seed=3, device='cpu', resume_from=resume, log_level='WARNING')
        if stop_after is not None:
            class Stop(Hook):
                def after_train_iter(self, t):
                    if t.iter + 1 == stop_after:
                        t.save_checkpoint('mid.pth')
                        t.request_stop('test')
            trainer.register_hook(Stop())
        trainer.train()
        return trainer, data

    full, _ = run()
    run(stop_after=8)  # epoch 1 (second epoch), batch 2 of 6
    data = CountingData(24)
    resumed, data = run(resume=str(tmp_path / 'mid.pth'), data=data)
    assert len(data.fetched) == 4 * 4  # only the 4 remaining batches of the second epoch
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)


def test_shuffled_order_depends_only_on_seed_and_epoch(tmp_path):
    orders = []
    for _ in range(2):
        data = CountingData(12)
        trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.01),
                          train_dataloader=DataLoader(data, batch_size=4, shuffle=True), max_epochs=2,
                          work_dir=tmp_path, seed=7, device='cpu', log_level='WARNING')
        torch.manual_seed(123 + len(orders))  # global RNG must not matter
        trainer.train()
        orders.append(data.fetched)
    assert orders[0] == orders[1]
    assert orders[0][:12] != orders[0][12:] and sorted(orders[0][:12]) == list(range(12))
