"""Checkpoint files and CheckpointHook: format, safety, failures, retention, best, export."""
import errno
import os

import pytest
import torch
from torch.utils.data import DataLoader

import hookloop.checkpoint.format as ckpt_module
from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer, save_checkpoint, update_pointer
from hookloop.errors import CheckpointError, ConfigError
from hookloop.hooks import CheckpointHook
from resume_helpers import assert_states_equal


def make_trainer(work_dir, epochs=2, checkpoint=None, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_epochs=epochs,
                   work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=checkpoint or dict(interval=1), **kwargs)


def scripted_metric(name, values):
    """An evaluator function whose successive results are given in advance (the validation
    loaders here have one batch, so each validation reads the next value). A function, not
    a reset/update/compute object, so the trainer does not import torchmetrics to inspect it."""
    values = iter(values)
    return lambda outputs, batch: {name: next(values)}


def test_checkpoint_holds_everything_and_loads_with_weights_only(tmp_path):
    trainer = train(make_trainer(tmp_path, custom_hooks=[dict(type='EMAHook')]))
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', weights_only=True)
    assert checkpoint['meta']['epoch'] == 1 and checkpoint['meta']['iter'] == 5
    assert checkpoint['meta']['inner_iter'] == 0 and checkpoint['meta']['seed'] == 0
    assert {'state_dict', 'optimizer', 'hooks', 'rng', 'ema_state_dict'} <= checkpoint.keys()
    assert {'python', 'numpy', 'torch'} <= checkpoint['rng'].keys()
    assert 'CheckpointHook' in checkpoint['hooks'] and 'EMAHook' in checkpoint['hooks']
    assert read_pointer(tmp_path) == str(tmp_path / 'epoch_2.pth')
    assert_states_equal(torch.load(tmp_path / 'epoch_2.pth', weights_only=True)['state_dict'],
                        trainer.model.state_dict())


def test_malicious_checkpoint_is_refused_and_runs_no_code(tmp_path):
    marker = tmp_path / 'pwned'

    class Payload:
        def __reduce__(self):
            return (os.system, (f'touch {marker}',))

    path = tmp_path / 'evil.pth'
    torch.save({'meta': {}, 'state_dict': {}, 'payload': Payload()}, path)
    with pytest.raises(CheckpointError, match='refusing to load .*posix.system'):
        load_checkpoint(str(path))
    trainer = make_trainer(tmp_path / 'run', resume_from=str(path))
    with pytest.raises(CheckpointError, match='refusing'):
        trainer.train()
    assert trainer.iter == 0
    trainer.close()
    with pytest.raises(CheckpointError, match='refusing'):
        make_trainer(tmp_path / 'run2', load_from=str(path)).train()
    assert not marker.exists()


def test_truncated_or_missing_checkpoint_gives_clear_error(tmp_path):
    train(make_trainer(tmp_path, epochs=1))
    data = (tmp_path / 'epoch_1.pth').read_bytes()
    (tmp_path / 'cut.pth').write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='not a readable checkpoint'):
        load_checkpoint(str(tmp_path / 'cut.pth'))
    with pytest.raises(CheckpointError, match='does not exist'):
        make_trainer(tmp_path, resume_from=str(tmp_path / 'nope.pth'))
    # A pointer naming a file that is gone: --resume auto falls back to the newest good one.
    update_pointer(str(tmp_path), str(tmp_path / 'gone.pth'))
    trainer = train(make_trainer(tmp_path, epochs=2, auto_resume=True))
    assert trainer.resumed_from == str(tmp_path / 'epoch_1.pth')


def test_failed_write_raises_and_keeps_previous_checkpoint_and_pointer(tmp_path, monkeypatch):
    good = {'meta': {'iter': 1}, 'state_dict': {'w': torch.ones(3)}}
    save_checkpoint(good, str(tmp_path / 'iter_1.pth'))
    update_pointer(str(tmp_path), str(tmp_path / 'iter_1.pth'))

    def disk_full(obj, file):
        file.write(b'x' * 1000)  # part of the file is written, then the disk fills up
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(ckpt_module.torch, 'save', disk_full)
    trainer = make_trainer(tmp_path, epochs=1, checkpoint=dict(interval=1, by_epoch=False))
    # iter_1.pth was written by another run: this one never overwrites it, its file is iter_1.run1.pth
    with pytest.raises(CheckpointError, match=r'iter_1\.run1\.pth: No space left on device; the previous checkpoint '
                                              'is kept'):
        trainer.train()
    trainer.close()
    monkeypatch.undo()
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_1.pth')
    assert torch.equal(load_checkpoint(str(tmp_path / 'iter_1.pth'))['state_dict']['w'], torch.ones(3))
    assert not [name for name in os.listdir(tmp_path) if name.endswith('.tmp')]


def test_stale_temporary_files_are_removed_at_start(tmp_path):
    stale = tmp_path / '.iter_3.pth.abc123.tmp'
    stale.write_bytes(b'half a checkpoint')
    train(make_trainer(tmp_path, epochs=1))
    assert not stale.exists()


def test_retention_with_save_best_never_removes_best_or_latest(tmp_path):
    accuracy = [0.5, 0.875, 0.625, 0.75, 0.25]  # best after epoch 2
    trainer = train(make_trainer(
        tmp_path, epochs=5, checkpoint=dict(interval=1, max_keep_ckpts=2, save_best='accuracy'),
        val_dataloader=DataLoader(regression_data(8), batch_size=8),
        val_evaluator=scripted_metric('accuracy', accuracy), evaluation=dict(interval=1)))
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth'))
    assert names == ['best_accuracy_epoch_2.pth', 'epoch_4.pth', 'epoch_5.pth']
    assert read_pointer(tmp_path) == str(tmp_path / 'epoch_5.pth')
    best = load_checkpoint(str(tmp_path / 'best_accuracy_epoch_2.pth'))
    assert best['meta']['epoch'] == 2 and best['meta']['iter'] == 10
    hook = next(h for h in trainer.hooks if isinstance(h, CheckpointHook))
    assert hook.best.score == 0.875 and hook.best.rule == 'greater'


def test_retention_keeps_best_even_when_it_is_old_and_with_less_rule(tmp_path):
    # save_best on an iteration-based schedule; 'loss' is inferred as lower-is-better.
    losses = [3.0, 1.0, 2.0, 2.5, 2.2, 2.1]
    train(make_trainer(
        tmp_path, epochs=2, checkpoint=dict(interval=1, by_epoch=False, max_keep_ckpts=1, save_best='loss'),
        val_dataloader=DataLoader(regression_data(8), batch_size=8), val_evaluator=scripted_metric('loss', losses),
        evaluation=dict(interval=2, by_epoch=False)))
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth'))
    assert names == ['best_loss_iter_4.pth', 'iter_10.pth']


def test_best_tracking_survives_resume(tmp_path):
    values = [0.5, 0.875, 0.625, 0.75]
    options = dict(val_dataloader=DataLoader(regression_data(8), batch_size=8), evaluation=dict(interval=1),
                   checkpoint=dict(interval=1, save_best='acc'))
    train(make_trainer(tmp_path, epochs=2, val_evaluator=scripted_metric('acc', values[:2]), **options))
    resumed = train(make_trainer(tmp_path, epochs=4, auto_resume=True,
                                 val_evaluator=scripted_metric('acc', values[2:]), **options))
    hook = next(h for h in resumed.hooks if isinstance(h, CheckpointHook))
    assert hook.best.score == 0.875 and os.path.exists(tmp_path / 'best_acc_epoch_2.pth')
    assert not any(n.startswith('best_acc_epoch_4') for n in os.listdir(tmp_path))


@pytest.mark.parametrize('kwargs, words', [
    (dict(save_best='throughput'), "cannot tell whether a larger 'throughput' is better"),
    (dict(save_best='acc', rule='bigger'), "rule must be 'greater' or 'less'"),
    (dict(interval=0), 'interval must be'), (dict(max_keep_ckpts=0), 'max_keep_ckpts must be'),
    (dict(export_safetensors='yes'), 'export_safetensors must be'), (dict(save_best=''), 'save_best must be'),
])
def test_checkpoint_hook_bad_arguments_are_refused(kwargs, words):
    with pytest.raises(ConfigError, match='CheckpointHook ' + words.replace('(', r'\(')):
        CheckpointHook(**kwargs)


def test_unknown_save_best_metric_names_the_metrics_found(tmp_path):
    trainer = make_trainer(tmp_path, epochs=1, checkpoint=dict(interval=1, save_best='acc'),
                           val_dataloader=DataLoader(regression_data(8), batch_size=8),
                           val_evaluator=scripted_metric('top1', [0.3]), evaluation=dict(interval=1))
    with pytest.raises(ConfigError, match=r"save_best='acc' is not among the evaluation metrics \['top1'\]"):
        trainer.train()
    trainer.close()


def test_safetensors_export_of_model_and_ema_weights(tmp_path):
    from safetensors.torch import load_file
    trainer = train(make_trainer(tmp_path / 'model', epochs=1, checkpoint=dict(interval=1, export_safetensors=True)))
    assert_states_equal(load_file(tmp_path / 'model' / 'epoch_1.safetensors'), trainer.model.state_dict())
    trainer = train(make_trainer(tmp_path / 'ema', epochs=1, custom_hooks=[dict(type='EMAHook', momentum=0.5)],
                                 checkpoint=dict(interval=1, export_safetensors='ema')))
    exported = load_file(tmp_path / 'ema' / 'epoch_1.safetensors')
    ema = torch.load(tmp_path / 'ema' / 'epoch_1.pth', weights_only=True)['ema_state_dict']
    assert_states_equal(exported, ema)
    assert not torch.equal(exported['net.0.weight'], trainer.model.state_dict()['net.0.weight'])
    trainer = make_trainer(tmp_path / 'no_ema', epochs=1, checkpoint=dict(interval=1, export_safetensors='ema'))
    with pytest.raises(CheckpointError, match='register an EMAHook'):
        trainer.train()
    trainer.close()


def test_load_from_takes_weights_only_and_starts_a_fresh_schedule(tmp_path):
    first = train(make_trainer(tmp_path / 'first', epochs=1))
    second = make_trainer(tmp_path / 'second', epochs=1, load_from=str(tmp_path / 'first' / 'epoch_1.pth'))
    weights = {k: v.clone() for k, v in first.model.state_dict().items()}
    second.resolve_hooks()
    second.load_weights(second.load_from)
    assert_states_equal(second.model.state_dict(), weights)
    train(second)
    assert second.iter == 5 and second.epoch == 1  # counted from zero, not from the loaded run
    assert os.path.exists(tmp_path / 'second' / 'epoch_1.pth')


def test_evaluation_hook_save_best_auto_as_in_mmcv_configs(tmp_path):
    # MMCV configs write evaluation=dict(interval=1, save_best='auto'); the first metric is used.
    trainer = train(make_trainer(
        tmp_path, epochs=3, checkpoint=dict(interval=1, max_keep_ckpts=1),
        val_dataloader=DataLoader(regression_data(8), batch_size=8),
        val_evaluator=scripted_metric('top1', [0.25, 0.125, 0.5]), evaluation=dict(interval=1, save_best='auto')))
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth'))
    assert names == ['best_top1_epoch_3.pth', 'epoch_3.pth']
    assert load_checkpoint(str(tmp_path / 'best_top1_epoch_3.pth'))['meta']['epoch'] == 3
    hook = next(h for h in trainer.hooks if h.ROLE == 'evaluation')
    assert hook.best.score == 0.5 and hook.best.rule == 'greater'
    with pytest.raises(ConfigError, match="EvaluationHook rule must be 'greater' or 'less'"):
        make_trainer(tmp_path, evaluation=dict(save_best='acc', rule='up'))
