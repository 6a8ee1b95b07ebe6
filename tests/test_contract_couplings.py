"""Each coupling the contract table of docs/hooks.md replaced, one test each; each fails on the
old behaviour (a hook writing the state itself, duck-typed attributes, private parts)."""
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data, train_and_close
from contract_trace import trace
from hookloop import Hook, Trainer
from test_contracts import MMCVStyleHead, NaNAt, every_hook_by_iteration, violations


def test_mmcv_eval_hook_sets_its_loader_through_the_trainer(tmp_path):
    # It wrote trainer.val_dataloader / val_evaluator itself; now trainer.set_validation does.
    import logging

    from mmcv_style.toy import ToyClassifier, ToyImageDataset

    from hookloop.compat.mmcv import EpochBasedRunner, EvalHook
    torch.manual_seed(0)
    model = ToyClassifier(backbone=dict(width=8), head=dict(num_classes=2))
    val_set = ToyImageDataset('root', [], split='val', size=8)
    runner = EpochBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), work_dir=str(tmp_path),
                              max_epochs=1, meta=dict(seed=0), logger=logging.getLogger('test'))
    runner.register_training_hooks(lr_config=None, optimizer_config=dict(grad_clip=None),
                                   log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook')]))
    runner.register_hook(EvalHook(DataLoader(val_set, batch_size=4), interval=1, metric='accuracy', topk=1),
                         priority='LOW')
    log = trace(runner.trainer)
    try:
        runner.run([DataLoader(ToyImageDataset('root', [], size=16), batch_size=8)], [('train', 1)])
    finally:
        runner.close()
    assert val_set.evaluated == [8]
    assert set(log.writes['trainer.val_dataloader']) == {'hookloop.engine.trainer'}
    assert violations(log.writes) == []


class Sink(Hook):
    """Not a logger: joins the image channel by declaring it."""

    def __init__(self):
        self.got = []

    def accepts_images(self, trainer):
        return True

    def log_images(self, trainer, tag, images, step):
        self.got.append((tag, len(images), images[0].shape, step))


def test_the_image_channel_asks_each_hook_and_no_logger_internals(tmp_path):
    # publish_images walked the LoggerHooks and wrote through their private ``_opened``.
    import ast

    from hookloop.hooks.loggers.base import LoggerHook
    from hookloop.logging import images as channel

    class Refusing(LoggerHook):
        def log(self, trainer, record):
            pass

        def log_images(self, trainer, tag, images, step):
            raise AssertionError('a logger that does not accept images got some')

        def accepts_images(self, trainer):
            return False

    sink, refusing = Sink(), Refusing()
    trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.01), max_iters=1, work_dir=str(tmp_path),
                      train_dataloader=DataLoader(regression_data(), batch_size=4), device='cpu', log_level='WARNING')
    trainer.register_hook(sink)
    trainer.register_hook(refusing)
    channel.publish_images(trainer, 'grid', [torch.zeros(3, 4, 5)], 7)
    assert sink.got == [('grid', 1, (4, 5, 3), 7)]
    imported = [node for node in ast.walk(ast.parse(open(channel.__file__).read()))
                if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not any('hooks' in (getattr(node, 'module', None) or '') for node in imported)
    assert '_opened' not in open(channel.__file__).read()
    trainer.close()


def test_a_closed_or_imageless_logger_does_not_accept_images(tmp_path):
    from hookloop.hooks import TextLoggerHook
    from hookloop.hooks.loggers.tensorboard import TensorboardLoggerHook
    text, board = TextLoggerHook(), TensorboardLoggerHook()
    assert not board.accepts_images(None)  # not open
    board._opened = text._opened = True  # (as open() leaves them: only the channel's answer is tested)
    assert board.accepts_images(None) and not text.accepts_images(None)  # the text log has no image API


class OwnOutputs(Hook):
    """Writes into ``path``; says so through output_dirs."""

    def __init__(self, path):
        self.path = path

    def output_dirs(self, trainer):
        return {'export': str(self.path)}


class DuckOutDir(Hook):
    """An ``out_dir`` attribute that is not a directory the hook writes (e.g. a source)."""

    def __init__(self, path):
        self.out_dir = str(path)


def small_trainer(work_dir, **kwargs):
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.01), work_dir=str(work_dir), device='cpu',
                   train_dataloader=DataLoader(regression_data(), batch_size=4), log_level='WARNING', seed=0,
                   **{'max_iters': 2, **kwargs})


def test_preflight_asks_output_dirs_not_an_out_dir_attribute(tmp_path):
    from hookloop import ConfigError
    blocker = tmp_path / 'a_file'
    blocker.write_text('x')
    trainer = small_trainer(tmp_path / 'duck')
    trainer.register_hook(DuckOutDir(blocker))  # duck typing read this; no longer
    train_and_close(trainer)
    trainer = small_trainer(tmp_path / 'declared')
    trainer.register_hook(OwnOutputs(blocker))
    with pytest.raises(ConfigError, match='OwnOutputs: export directory .* is a file'):
        trainer.train()
    assert not (tmp_path / 'declared').exists()  # refused before anything was written
    trainer.close()


def test_an_evaluation_hook_that_brings_its_loader_says_so(tmp_path):
    from hookloop.hooks import EvaluationHook

    class OwnLoader(EvaluationHook):
        def __init__(self, loader):
            super().__init__(interval=1)
            self.loader = loader

        def evaluation_loader(self, trainer):
            return self.loader

        def before_run(self, trainer):
            trainer.set_validation(self.loader, lambda loss, batch: {'mse': loss})

    trainer = small_trainer(tmp_path, max_iters=None, max_epochs=1)
    trainer.register_hook(OwnLoader(DataLoader(regression_data(n=8, seed=1), batch_size=4)))
    train_and_close(trainer)  # the pre-run check used to look for a ``dataloader`` attribute
    assert 'mse' in trainer.metrics


def test_the_run_summary_finds_checkpoints_through_output_dirs(tmp_path, monkeypatch):
    from hookloop.engine.run_summary import summary_items
    trainer = small_trainer(tmp_path, checkpoint_config=dict(interval=1, by_epoch=False, out_dir='ckpts'))
    train_and_close(trainer)
    monkeypatch.setattr(Trainer, '_checkpoint_dirs', lambda self: pytest.fail('a private trainer method'),
                        raising=False)
    items = summary_items(trainer, 0.0, 0)
    assert items['last checkpoint'] == os.path.join('ckpts', 'iter_2.pth')


@pytest.mark.parametrize('how', ['finished', 'stopped', 'failed'])
def test_hooks_read_how_the_run_ended_from_trainer_outcome(tmp_path, how):
    class Ending(Hook):
        def after_train_iter(self, trainer):
            if how == 'stopped':
                trainer.request_stop('enough')
            elif how == 'failed':
                raise ZeroDivisionError('boom')

        def after_run(self, trainer):
            self.seen = trainer.outcome

    ending = Ending()
    trainer = small_trainer(tmp_path)
    trainer.register_hook(ending)
    assert trainer.outcome.state == 'not started'
    if how == 'failed':
        with pytest.raises(ZeroDivisionError):
            train_and_close(trainer)
    else:
        train_and_close(trainer)
    outcome = ending.seen
    assert outcome.state == how and trainer.outcome == outcome
    assert (outcome.reason == 'enough') == (how == 'stopped')
    assert isinstance(outcome.exception, ZeroDivisionError) == (how == 'failed')
    assert trainer.exception is outcome.exception and trainer.stop_reason == outcome.reason  # MMCV-style views
    with pytest.raises(AttributeError, match='read-only'):
        outcome.state = 'finished'


def hook_modules():
    """The source of every hook module: hooks/**, dreambooth's hooks, compat's hooks (not the MMCV
    Runner facade, which stands in for the trainer)."""
    import glob
    root = os.path.join(os.path.dirname(__file__), '..', 'hookloop')
    paths = glob.glob(os.path.join(root, 'hooks', '**', '*.py'), recursive=True)
    paths += [os.path.join(root, 'dreambooth', name) for name in ('save_pipeline_hook.py', 'validation.py')]
    paths += glob.glob(os.path.join(root, 'compat', '*hooks*.py'))
    paths += [p for p in glob.glob(os.path.join(root, 'compat', 'mmcv', '**', '*.py'), recursive=True)
              if not p.endswith('runner.py')]
    return {os.path.relpath(p, root): open(p, encoding='utf-8').read() for p in paths}


def trainer_attribute_uses(source):
    """``(attribute, is_write)`` of every ``trainer.<attribute>`` / ``runner.<attribute>`` in ``source``."""
    import ast
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in ('trainer', 'runner'):
            found.append((node.attr, isinstance(node.ctx, ast.Store)))
        if isinstance(node, ast.Call) and getattr(node.func, 'id', None) in ('getattr', 'hasattr', 'setattr') and \
                node.args and getattr(node.args[0], 'id', None) in ('trainer', 'runner') and len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant):
            found.append((node.args[1].value, node.func.id == 'setattr'))
    return found


def test_hooks_read_the_outcome_not_trainer_exception_and_no_private_trainer_state():
    bad = []
    for path, source in hook_modules().items():
        for attribute, is_write in trainer_attribute_uses(source):
            if attribute in ('exception', 'stop_reason') or attribute.startswith('_'):
                bad.append(f'{path}: trainer.{attribute}')
    assert bad == []


def test_hooks_assign_no_trainer_attribute():
    # 11 trainer attributes were written by hooks; they now call the trainer's methods.
    bad = [f'{path}: trainer.{attribute} = ...' for path, source in hook_modules().items()
           for attribute, is_write in trainer_attribute_uses(source) if is_write]
    assert bad == []


def test_profile_record_reaches_the_copied_json_log(tmp_path):
    # The profiler appended to the JSON log by path after the logger closed it: the copy in
    # out_dir (and, with keep_local=False, every copy) had no profile record.
    import json
    out = tmp_path / 'out'
    trainer = small_trainer(tmp_path / 'work', profile_hooks=True,
                            log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook', out_dir=str(out),
                                                                    keep_local=False)]))
    train_and_close(trainer)
    copied = [p for p in (out / 'work').iterdir() if p.name.endswith('.log.json')]
    records = [json.loads(line) for line in copied[0].read_text().splitlines()]
    profile = [r for r in records if r.get('mode') == 'profile']
    assert len(profile) == 1 and profile[0]['iter'] == 2
    assert {(r['hook'], r['stage']) for r in profile[0]['hooks']} >= {('OptimizerHook', 'after_train_iter')}


def test_fp16_switches_have_one_writer(tmp_path):
    # The optimizer hook set module.fp16_enabled itself; now optim.amp.enable_fp16 does, for
    # the modules that declare the switch only (MMCV's wrap_fp16_model).
    from hookloop.compat.mmcv import wrap_fp16_model
    model = NaNAt(at=-1)
    assert wrap_fp16_model(model) is model and model.head.fp16_enabled is True
    assert not any(hasattr(m, 'fp16_enabled') for m in model.modules() if m is not model.head)
    trainer = small_trainer(tmp_path, optimizer_config=dict(precision='fp16'))
    trainer.model.add_module('head', MMCVStyleHead())
    log = trace(trainer)
    train_and_close(trainer)
    assert trainer.model.head.fp16_enabled is True
    assert set(log.writes['module.fp16_enabled']) == {'hookloop.optim.amp'}


def test_param_group_writes_go_through_optim_param_groups(tmp_path):
    # Six writers changed lr / momentum / their bases directly.
    from hookloop.checkpoint.resume_changes import apply_optimizer_changes
    from hookloop.compat.modelscope_warmup import WarmupScheduler
    from contract_trace import WriteLog, _wrap_groups

    def warmup(optimizer):
        return WarmupScheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=2), warmup_iters=3)

    trainer = small_trainer(tmp_path, max_iters=6,
                            custom_hooks=[dict(type='TorchSchedulerHook', scheduler=warmup, by_epoch=False)])
    log = trace(trainer)
    train_and_close(trainer)
    assert set(log.writes['param_group.lr']) == {'hookloop.optim.param_groups'}
    # a resume with a changed config sets the new values through the one writer
    optimizer = torch.optim.SGD(Regressor().parameters(), lr=0.1)
    resumed = WriteLog()
    _wrap_groups(optimizer, resumed)
    changes = [('optimizer.lr', 0.1, 0.2)]
    written = []

    def set_value(group, key, value):
        written.append((key, value))
        group[key] = value
    lines = apply_optimizer_changes(optimizer, changes, lambda: None, set_value)
    assert lines and written == [('lr', 0.2), ('initial_lr', 0.2)]
    assert optimizer.param_groups[0]['lr'] == 0.2


def test_ema_resume_is_asked_for_not_done_by_the_hook(tmp_path, monkeypatch):
    # EMAHook.before_run called trainer.resume() inside a stage and rewrote the position.
    first = small_trainer(tmp_path / 'a', max_iters=4, checkpoint_config=dict(interval=2, by_epoch=False),
                          custom_hooks=[dict(type='EMAHook', interval=1, warm_up=1)])
    train_and_close(first)
    monkeypatch.setattr(Trainer, 'resume', lambda *a, **k: pytest.fail('a hook called trainer.resume()'))
    second = small_trainer(tmp_path / 'b', max_iters=4,
                           custom_hooks=[dict(type='EMAHook', interval=1, warm_up=1,
                                              resume_from=str(tmp_path / 'a' / 'iter_2.pth'))])
    log = trace(second)
    train_and_close(second)
    assert second.resumed_from.endswith('iter_2.pth') and second.iter == 4
    assert violations(log.writes) == []


def test_the_rollback_restores_other_hooks_only_through_their_state_methods(tmp_path, monkeypatch):
    from hookloop.hooks import EMAHook, OptimizerHook
    loaded = []
    for cls in (EMAHook, OptimizerHook):
        original = cls.load_state_dict
        monkeypatch.setattr(cls, 'load_state_dict',
                            lambda self, state, original=original: (loaded.append(type(self).__name__),
                                                                    original(self, state))[1])
    trainer = every_hook_by_iteration(tmp_path)
    log = trace(trainer)
    train_and_close(trainer)
    assert sorted(loaded) == ['EMAHook', 'OptimizerHook']  # one rollback: through load_state_dict
    assert violations(log.writes) == []
