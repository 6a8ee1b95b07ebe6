"""CheckInvalidLossHook: raise / skip / rollback, against plain loops that do the same by hand."""
import copy

import pytest
import torch
from torch.utils.data import DataLoader

from hookloop import ConfigError, InvalidLossError, Trainer
from hookloop.hooks import CheckInvalidLossHook
from conftest import Regressor, regression_data

BAD_ITER = 3  # the 4th batch of every epoch holds a NaN sample


def poisoned_data():
    data = regression_data(n=40)
    data.tensors[0][BAD_ITER * 8 + 1, 2] = float('nan')
    return data


def fresh_pair():
    torch.manual_seed(0)
    model, reference = Regressor(), Regressor()
    reference.load_state_dict(model.state_dict())
    return model, reference


def make_trainer(tmp_path, model, hook, epochs=2, cumulative_iters=1):
    return Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=DataLoader(poisoned_data(), batch_size=8), max_epochs=epochs, work_dir=tmp_path,
                   seed=0, device='cpu', custom_hooks=[hook], optimizer_config=dict(cumulative_iters=cumulative_iters))


def assert_same_weights(model, reference):
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def all_finite(model):
    return all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_hook_runs_before_the_optimizer_whatever_its_priority(tmp_path):
    trainer = make_trainer(tmp_path, Regressor(), dict(type='CheckInvalidLossHook', priority='LOWEST'))
    table = trainer.resolve_hooks()
    roles = [h.ROLE for h in table['after_train_iter']]
    assert roles.index('invalid_loss') < roles.index('optimizer')
    trainer.close()


def test_raise_names_iteration_keys_and_values_before_the_step(tmp_path):
    model = Regressor()
    trainer = make_trainer(tmp_path, model, CheckInvalidLossHook(interval=1))
    with pytest.raises(InvalidLossError, match=r'loss is not finite at iteration 4 \(epoch 1, inner iteration 4\): '
                                               r'loss=nan'):
        trainer.train()
    trainer.close()
    assert trainer.iter == BAD_ITER and all_finite(model)  # the bad loss never reached the weights


def test_raise_checks_only_on_its_interval(tmp_path):
    model = Regressor()
    trainer = make_trainer(tmp_path, model, CheckInvalidLossHook(interval=5))
    with pytest.raises(InvalidLossError, match='at iteration 5 '):  # iteration 4's NaN went unseen
        trainer.train()
    trainer.close()
    assert not all_finite(model)


def plain_loop(reference, policy, epochs=2, n=1, interval=2):
    """Skip: drop the window holding a bad loss. Rollback: also restore the last good snapshot
    (taken before iteration 0 and every ``interval`` iterations, good once its forward is finite)."""
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    good = candidate = None
    it = 0
    for _ in range(epochs):
        batches = list(DataLoader(poisoned_data(), batch_size=8))
        for start in range(0, len(batches), n):
            window, dropped = batches[start:start + n], False
            for x, y in window:
                if policy == 'rollback' and (good is None or it % interval == 0):
                    candidate = (copy.deepcopy(reference.state_dict()), copy.deepcopy(optimizer.state_dict()))
                loss = reference(x, y)
                if torch.isfinite(loss):
                    good, candidate = (candidate, None) if candidate is not None else (good, None)
                    if not dropped:
                        (loss / len(window)).backward()
                else:
                    dropped, candidate = True, None
                    if policy == 'rollback':
                        reference.load_state_dict(good[0])
                        optimizer.load_state_dict(copy.deepcopy(good[1]))
                it += 1
            if not dropped:
                optimizer.step()
            optimizer.zero_grad()


@pytest.mark.parametrize('n', [1, 2, 3])  # the bad iteration ends, then starts, a window
def test_skip_drops_the_window_holding_the_bad_loss(tmp_path, n):
    model, reference = fresh_pair()
    trainer = make_trainer(tmp_path, model, CheckInvalidLossHook(on_invalid='skip'), cumulative_iters=n)
    trainer.train()
    trainer.close()
    plain_loop(reference, 'skip', n=n)
    assert_same_weights(model, reference)
    assert all_finite(model)
    log = open(next(tmp_path.glob('*.log'))).read()
    assert log.count('dropped this update') == 2  # once per epoch


def test_rollback_restores_last_good_state_and_continues_to_a_finite_result(tmp_path):
    model, reference = fresh_pair()
    trainer = make_trainer(tmp_path, model, CheckInvalidLossHook(interval=2, on_invalid='rollback'), epochs=3)
    trainer.train()
    trainer.close()
    plain_loop(reference, 'rollback', epochs=3, interval=2)
    assert_same_weights(model, reference)
    assert all_finite(model)
    log = open(next(tmp_path.glob('*.log'))).read()
    assert 'rolled model, optimizer, OptimizerHook back to their state before iteration 3' in log


def test_rollback_differs_from_skip(tmp_path):
    skipped, rolled = fresh_pair()
    for sub, model, policy in (('s', skipped, 'skip'), ('r', rolled, 'rollback')):
        trainer = make_trainer(tmp_path / sub, model, CheckInvalidLossHook(interval=2, on_invalid=policy))
        trainer.train()
        trainer.close()
    assert not torch.equal(skipped.net[0].weight, rolled.net[0].weight)


@pytest.mark.parametrize('kwargs, message', [
    (dict(interval=0), 'interval must be a positive int, got 0'),
    (dict(on_invalid='ignore'), "on_invalid must be one of \\['raise', 'skip', 'rollback'\\], got 'ignore'"),
    (dict(loss_keys=[]), 'loss_keys must be None, a key or a list of keys'),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CheckInvalidLossHook(**kwargs)


def test_unknown_loss_key_is_named(tmp_path):
    trainer = make_trainer(tmp_path, Regressor(), CheckInvalidLossHook(interval=1, loss_keys='loss_cls'))
    with pytest.raises(ConfigError, match=r"loss_keys \['loss_cls'\] are not in the model outputs \['loss'\]"):
        trainer.train()
    trainer.close()


def test_rollback_keeps_the_current_learning_rate(tmp_path):
    from hookloop import Hook

    class HalveEachEpoch(Hook):
        def before_train_epoch(self, trainer):
            for group in trainer.optimizer.param_groups:
                group['lr'] = 0.05 / (trainer.epoch + 1)

    model = Regressor()
    # snapshots before iterations 0, 4, 8: the one of iteration 8 (epoch 2) is not yet good when
    # its loss is NaN, so the state rolls back to iteration 4, in epoch 1 (lr 0.05)
    trainer = make_trainer(tmp_path, model, CheckInvalidLossHook(interval=4, on_invalid='rollback'))
    trainer.register_hook(HalveEachEpoch())
    trainer.train()
    trainer.close()
    log = open(next(tmp_path.glob('*.log'))).read()
    assert 'back to their state before iteration 5' in log
    assert trainer.optimizer.param_groups[0]['lr'] == 0.025 and all_finite(model)
