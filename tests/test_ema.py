"""EMAHook: MMCV's update rule against a hand-written EMA, ordering, swap, resume."""
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Trainer
from hookloop.errors import ConfigError
from hookloop.hooks import EMAHook
from hookloop.hooks.order import stage_table
from resume_helpers import assert_states_equal

MOMENTUM, INTERVAL, WARM_UP = 0.3, 2, 3


def hand_written_ema(epochs, momentum=MOMENTUM, interval=INTERVAL, warm_up=WARM_UP):
    """A plain SGD loop with MMCV's EMA written out; returns the EMA after each iteration."""
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ema = {name: p.detach().clone() for name, p in model.named_parameters()}
    history, step = [], 0
    effective = momentum ** interval
    for _ in range(epochs):
        for x, y in DataLoader(regression_data(), batch_size=8):
            model(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % interval == 0:
                m = min(effective, (1 + step) / (warm_up + step))
                for name, p in model.named_parameters():
                    ema[name] = ema[name] * (1 - m) + m * p.detach()
            history.append({k: v.clone() for k, v in ema.items()})
            step += 1
    return history


def make_trainer(work_dir, priority='LOWEST', epochs=2, **kwargs):
    torch.manual_seed(0)
    model = Regressor()
    loader = DataLoader(regression_data(), batch_size=8)
    ema = dict(type='EMAHook', momentum=MOMENTUM, interval=INTERVAL, warm_up=WARM_UP, priority=priority)
    ema.update(kwargs.pop('ema', {}))
    return Trainer(model, optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_epochs=epochs,
                   work_dir=work_dir, seed=0, device='cpu', custom_hooks=[ema],
                   checkpoint_config=dict(interval=1, by_epoch=False), log_config=dict(interval=100), **kwargs)


def ema_hook(trainer):
    return next(h for h in trainer.hooks if isinstance(h, EMAHook))


def test_ema_matches_hand_written_ema_and_checkpoints_hold_it(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.train()
    trainer.close()
    history = hand_written_ema(2)
    averaged = ema_hook(trainer).ema_state_dict()
    assert averaged.keys() == trainer.model.state_dict().keys()
    # Not torch.equal: the hook's add_(p, alpha=m) rounds m * p inside the fused add, the
    # hand-written (1 - m) * ema + m * p rounds it separately: one float32 ulp apart at most.
    for key, value in history[-1].items():
        assert torch.allclose(averaged[key], value, rtol=0, atol=1e-7), key
    # Registered with priority LOWEST, EMA still updates before every checkpoint is written:
    # iter_k.pth holds the average after k iterations, not k - 1.
    for k in (1, 4, 7):
        saved = torch.load(tmp_path / f'iter_{k}.pth', weights_only=True)['ema_state_dict']
        for key, value in history[k - 1].items():
            assert torch.allclose(saved[key], value, rtol=0, atol=1e-7), (k, key)


def test_ema_runs_after_optimizer_and_before_checkpoint_and_evaluation_whatever_the_priority(tmp_path):
    for priority in ('LOWEST', 'HIGHEST'):
        trainer = make_trainer(tmp_path / priority, priority=priority, evaluation=dict(interval=1),
                               val_dataloader=DataLoader(regression_data(8), batch_size=8))
        table = trainer.resolve_hooks()
        for stage, hooks in table.items():
            roles = [h.ROLE for h in hooks]
            if 'ema' not in roles:
                continue
            ema_at = roles.index('ema')
            for later in ('checkpoint', 'evaluation'):
                if later in roles:
                    assert ema_at < roles.index(later), (priority, stage, roles)
            if 'optimizer' in roles:
                assert roles.index('optimizer') < ema_at, (priority, stage, roles)
        trainer.close()
    # The same as a pure function of the hooks.
    from hookloop.hooks import CheckpointHook, OptimizerHook
    table = stage_table([CheckpointHook(), EMAHook(), OptimizerHook()])
    assert [type(h).__name__ for h in table['after_train_iter']] == ['OptimizerHook', 'EMAHook', 'CheckpointHook']


def test_ema_swap_evaluates_averaged_weights_and_leaves_training_weights_intact(tmp_path):
    val_loader = DataLoader(regression_data(16, seed=1), batch_size=16)

    def mse(outputs, batch):
        return {'loss': outputs} if outputs.dim() == 0 else {}

    trainer = make_trainer(tmp_path, epochs=1, ema=dict(swap=True), val_dataloader=val_loader,
                           val_evaluator=mse)
    trainer.train()
    raw = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.val()
    assert_states_equal(trainer.model.state_dict(), raw)
    averaged = Regressor()
    averaged.load_state_dict(ema_hook(trainer).ema_state_dict())
    x, y = next(iter(val_loader))
    with torch.no_grad():
        expected = averaged(x, y).item()
    assert metrics['loss'] == pytest.approx(expected, rel=1e-6)
    trainer.close()


def test_ema_resume_from_continues_like_an_uninterrupted_run(tmp_path):
    reference = make_trainer(tmp_path / 'ref', epochs=2)
    reference.train()
    reference.close()
    resumed = make_trainer(tmp_path / 'resumed', epochs=2, ema=dict(resume_from=str(tmp_path / 'ref' / 'iter_3.pth')))
    resumed.train()
    resumed.close()
    assert_states_equal(ema_hook(resumed).ema_state_dict(), ema_hook(reference).ema_state_dict())
    assert_states_equal(resumed.model.state_dict(), reference.model.state_dict())


@pytest.mark.parametrize('kwargs, words', [
    (dict(momentum=1.5), 'momentum'), (dict(momentum=0), 'momentum'), (dict(interval=0), 'interval'),
    (dict(warm_up=-1), 'warm_up'), (dict(resume_from=3), 'resume_from'),
])
def test_ema_bad_arguments_are_refused(kwargs, words):
    with pytest.raises(ConfigError, match=f'EMAHook {words}'):
        EMAHook(**kwargs)
