"""Trainer life-cycle cases: resume() before train(), defaults that step aside, repeated train(),
resume errors, 'auto' with load_from, validation counter, EvaluationHook start."""
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data, train_and_close
from hookloop import CheckpointError, ConfigError, Hook, Trainer
from hookloop.hooks import EvaluationHook


def make(tmp_path, model=None, **kwargs):
    kwargs.setdefault('max_iters', 6)
    return Trainer(model or Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=DataLoader(regression_data(n=16), batch_size=4, shuffle=True),
                   work_dir=tmp_path, seed=1, device='cpu', log_level='WARNING', **kwargs)


def weights(trainer):
    return [t.clone() for t in trainer.model.state_dict().values()]


def test_resume_called_before_train_continues_exactly_with_ema(tmp_path):
    options = dict(checkpoint_config=dict(interval=3, by_epoch=False), custom_hooks=[dict(type='EMAHook', warm_up=1)])
    full = train_and_close(make(tmp_path / 'a', **options))
    resumed = make(tmp_path / 'b', **options)
    resumed.resume(str(tmp_path / 'a' / 'iter_3.pth'))  # MMCV style: runner.resume(path); runner.run()
    train_and_close(resumed)
    assert all(torch.equal(a, b) for a, b in zip(weights(full), weights(resumed)))
    ema = [h for h in full.hooks if type(h).__name__ == 'EMAHook'][0].ema_state_dict()
    ema_resumed = [h for h in resumed.hooks if type(h).__name__ == 'EMAHook'][0].ema_state_dict()
    assert all(torch.equal(ema[k], ema_resumed[k]) for k in ema)


def test_default_hooks_step_aside_for_registered_ones(tmp_path):
    trainer = make(tmp_path, val_dataloader=DataLoader(regression_data(n=8), batch_size=4),
                   val_evaluator=lambda outputs, batch: {'n': float(len(batch[0]))})
    trainer.val()  # resolves the hooks, with defaults, before any user hook
    trainer.register_training_hooks(optimizer_config=dict(cumulative_iters=2),
                                    log_config=dict(interval=2, hooks=[dict(type='TextLoggerHook')]))
    names = [type(h).__name__ for h in trainer.hooks]
    assert names.count('OptimizerHook') == 1 and names.count('TextLoggerHook') == 1
    assert [h.cumulative_iters for h in trainer.hooks if type(h).__name__ == 'OptimizerHook'] == [2]
    train_and_close(trainer)


def test_train_again_after_a_stop_continues(tmp_path):
    class StopOnce(Hook):
        done = False

        def after_train_iter(self, trainer):
            if not self.done and trainer.iter == 1:
                self.done = True
                trainer.request_stop('test')
    trainer = make(tmp_path)
    trainer.register_hook(StopOnce())
    trainer.train()
    assert trainer.iter == 2
    train_and_close(trainer)
    assert trainer.iter == 6


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    train_and_close(make(tmp_path / 'a', checkpoint_config=dict(interval=3, by_epoch=False)))
    other = make(tmp_path / 'b', model=Regressor(hidden=5), resume_from=str(tmp_path / 'a' / 'iter_3.pth'))
    with pytest.raises(CheckpointError, match='does not fit this model/optimizer'):
        train_and_close(other)


def test_resume_auto_with_load_from_uses_load_from_only_for_a_new_run(tmp_path):
    source = train_and_close(make(tmp_path / 'src', checkpoint_config=dict(interval=6, by_epoch=False)))
    start = str(tmp_path / 'src' / 'iter_6.pth')
    first = make(tmp_path / 'run', resume_from='auto', load_from=start, checkpoint_config=dict(interval=3, by_epoch=False))
    first.register_hook(type('Check', (Hook,), {'before_train_iter': lambda self, t: checks.append(
        all(torch.equal(a, b) for a, b in zip(weights(t), weights(source)))) if t.iter == 0 else None})())
    checks = []
    train_and_close(first)
    assert checks == [True]  # started from load_from's weights
    again = make(tmp_path / 'run', resume_from='auto', load_from=start, max_iters=9)
    train_and_close(again)
    assert again.iter == 9  # resumed at 6 from last_checkpoint, did not restart from load_from
    with pytest.raises(ConfigError, match='exclude each other'):
        make(tmp_path / 'x', resume_from=start, load_from=start)


def test_val_iter_counts_completed_validation_iterations(tmp_path):
    seen = []

    class Watch(Hook):
        def after_val_epoch(self, trainer):
            seen.append(trainer.val_iter)
    trainer = make(tmp_path, val_dataloader=DataLoader(regression_data(n=16), batch_size=4))
    trainer.register_hook(Watch())
    trainer.val()
    assert seen == [4]


@pytest.mark.parametrize('start,expected', [(None, [2, 4, 6, 7]), (3, [3, 5, 7]), (0, [2, 4, 6, 7])])
def test_evaluation_start_follows_mmcv(start, expected):
    hook = EvaluationHook(interval=2, start=start)
    assert [n for n in range(1, 8) if hook._due(n, n == 7)] == expected


def test_bad_configs_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match='start must be None or an int'):
        EvaluationHook(start='3')
    with pytest.raises(ConfigError, match="LrUpdaterHook config must be a dict"):
        make(tmp_path, lr_config='step')


def test_failed_write_reported_by_torch_as_runtime_error_is_a_checkpoint_error(tmp_path, monkeypatch):
    from hookloop.checkpoint import format as checkpoint_module

    def broken_save(obj, file):
        raise RuntimeError('PytorchStreamWriter failed writing file data/0: file write failed')
    monkeypatch.setattr(checkpoint_module.torch, 'save', broken_save)
    with pytest.raises(CheckpointError, match='could not write checkpoint .*file write failed'):
        checkpoint_module.save_checkpoint({'a': 1}, str(tmp_path / 'x.pth'))
    assert list(tmp_path.iterdir()) == []


def test_remove_checkpoint_handles_sharded_directories(tmp_path):
    from hookloop.checkpoint.format import remove_checkpoint
    shard_dir = tmp_path / 'iter_4.pth'
    shard_dir.mkdir()
    (shard_dir / '__0_0.distcp').write_bytes(b'x')
    single = tmp_path / 'iter_2.pth'
    single.write_bytes(b'x')
    remove_checkpoint(str(shard_dir))
    remove_checkpoint(str(single))
    assert list(tmp_path.iterdir()) == []
