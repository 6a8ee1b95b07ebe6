"""CheckInvalidLossHook's per-step test folded into the step's work (issue 26): the one host read is
of the loss itself (a scalar) or of one fused test; ``rollback`` is called before an iteration only
where it takes a snapshot. Decisions, snapshots and weights are those of the way before."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import hookloop.hooks.invalid_loss as invalid_loss
from hookloop import Trainer
from hookloop.hooks import CheckInvalidLossHook
from hookloop.hooks.base import NEVER
from conftest import Regressor, regression_data

NAN, INF = float('nan'), float('inf')


def old_decision(losses):
    return bool(torch.stack([torch.isfinite(v.detach()).all() for v in losses.values()]).all())


def old_next_call(self, trainer, stage, start):
    if stage == 'before_train_iter':
        return None if self.on_invalid == 'rollback' else NEVER
    return self.next_every_n_iters(start, self.interval) if self.on_invalid == 'raise' else None


CASES = [
    {'loss': torch.tensor(1.5)}, {'loss': torch.tensor(NAN)}, {'loss': torch.tensor(INF)},
    {'loss': torch.tensor(-INF)}, {'loss': torch.tensor(3e38)}, {'loss': torch.tensor(1e300, dtype=torch.float64)},
    {'loss': torch.tensor(NAN, dtype=torch.bfloat16)}, {'loss': torch.tensor(6e4, dtype=torch.float16)},
    {'loss': torch.tensor(2, dtype=torch.int64)}, {'loss': torch.tensor([1.0, NAN])}, {'loss': torch.tensor([2.0])},
    {'loss_a': torch.tensor(1.0), 'loss_b': torch.tensor(NAN)}, {'loss_a': torch.tensor(INF), 'loss_b': torch.tensor(-INF)},
    {'loss_a': torch.tensor(3e38), 'loss_b': torch.tensor(3e38)},  # finite each, inf summed: finite
    {'loss_a': torch.tensor(1.0), 'loss_b': torch.tensor([1.0, 2.0])}, {'loss_a': torch.tensor(1.0), 'loss_b': torch.tensor([INF])},
    {'loss_a': torch.tensor(1.0, requires_grad=True) * 2, 'loss_b': torch.tensor(0.5, dtype=torch.float64)},
]


@pytest.mark.parametrize('losses', CASES, ids=range(len(CASES)))
def test_decision_is_the_old_one(losses):
    assert invalid_loss._finite_on_host(losses) is old_decision(losses)


def test_a_scalar_loss_is_tested_on_the_host_without_a_kernel(monkeypatch):
    calls = []
    original = torch.isfinite
    monkeypatch.setattr(torch, 'isfinite', lambda t: calls.append(1) or original(t))
    assert invalid_loss._finite_on_host({'loss': torch.tensor(2.0)})
    assert not invalid_loss._finite_on_host({'loss': torch.tensor(NAN)})
    assert calls == []
    assert not invalid_loss._finite_on_host({'loss_a': torch.tensor(1.0), 'loss_b': torch.tensor(NAN),
                                             'loss_c': torch.tensor(2.0)})
    assert calls == [1]  # one fused test for the three keys


class TwoLosses(Regressor):
    def forward(self, x, y=None):
        loss = super().forward(x, y)
        return loss if y is None else {'loss_a': loss, 'loss_b': 0.5 * loss.detach() + x[:, 0].abs().mean()}


def poisoned():
    data = regression_data(n=48)
    data.tensors[0][3 * 8 + 1, 2] = NAN   # batch 3: both keys NaN
    data.tensors[1][4 * 8 + 2, 0] = 3e38  # batch 4: a finite sample whose squared error is inf
    return data


def count_snapshots(monkeypatch):
    """Record, on each hook, the iterations it is called at before an iteration and where it
    took a snapshot. The count wraps the class's method: a wrapper set on the hook itself or in
    a subclass would not do (the trainer calls a hook with such an override at every iteration,
    not trusting its schedule)."""
    method = CheckInvalidLossHook.before_train_iter

    def counted(self, trainer):
        self.calls.append(trainer.iter)
        before = self._candidate
        method(self, trainer)
        if self._candidate is not before:
            self.snapshots.append(trainer.iter)
    monkeypatch.setattr(CheckInvalidLossHook, 'before_train_iter', counted)


def run(tmp_path, policy, model_type, interval=3):
    torch.manual_seed(0)
    model = model_type()
    hook = CheckInvalidLossHook(interval=interval, on_invalid=policy)
    hook.calls, hook.snapshots = [], []
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(poisoned(), batch_size=8), max_epochs=3, work_dir=str(tmp_path),
                      seed=0, device='cpu', log_level='WARNING', custom_hooks=[hook],
                      optimizer_config=dict(loss_keys=['loss_a'] if model_type is TwoLosses else 'loss'))
    trainer.train()
    trainer.close()
    return model.state_dict(), hook


@pytest.mark.parametrize('policy', ['skip', 'rollback'])
@pytest.mark.parametrize('model_type', [Regressor, TwoLosses], ids=['one_loss', 'two_losses'])
def test_skip_and_rollback_are_bitwise_the_old_ones(tmp_path, monkeypatch, policy, model_type):
    count_snapshots(monkeypatch)
    weights, hook = run(tmp_path / 'new', policy, model_type)
    monkeypatch.setattr(invalid_loss, '_finite_on_host', old_decision)
    monkeypatch.setattr(CheckInvalidLossHook, 'next_call', old_next_call)
    want, old_hook = run(tmp_path / 'old', policy, model_type)
    assert all(torch.equal(weights[k], want[k]) for k in weights)
    assert all(torch.isfinite(v).all() for v in weights.values())
    if policy == 'rollback':
        assert hook.snapshots == old_hook.snapshots and len(hook.snapshots) > 1
        assert len(old_hook.calls) == 18  # the old way: called before every iteration
        # now: where a snapshot is taken, and once more right after the first (asked for the
        # next one before that first snapshot was found good)
        assert set(hook.snapshots) <= set(hook.calls) and len(hook.calls) <= len(hook.snapshots) + 1
    else:
        assert hook.calls == hook.snapshots == []
