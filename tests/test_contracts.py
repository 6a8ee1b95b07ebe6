"""The contract table of docs/hooks.md is what the code does: during runs with every built-in
hook, every write to the trainer, its position and step, the param groups' hyper-parameters and
MMCV's ``fp16_enabled`` comes from the one writer the table names (tests/contract_trace.py)."""
import io
import os
import re
import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data, train_and_close
from contract_trace import trace
from hookloop import Hook, Trainer

DOCS = os.path.join(os.path.dirname(__file__), '..', 'docs', 'hooks.md')
TRACED = ('trainer.', 'position.', 'step.', 'param_group.', 'module.')


# -- the table -----------------------------------------------------------------------------
def contract_rows():
    """The rows of the "Contracts" table: ``(names, writers)``; ``names``: the backticked
    ``trainer.x`` / ``trainer.position.x`` / ``trainer.step.x`` / ``optimizer.param_groups[*][...]`` /
    ``module.x`` of the first cell (methods left out); ``writers``: the backticked module paths of the third
    (``hookloop/engine/trainer.py``, or a package ``hookloop/engine/``)."""
    text = open(DOCS, encoding='utf-8').read()
    section = text.split('## Contracts: what hooks share', 1)[1].split('\n## ', 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
        if not line.startswith('|') or len(cells) < 4 or set(cells[0]) <= {'-', ' '} or cells[0] == 'contract':
            continue
        names = set()
        for token in re.findall(r'`([^`]+)`', cells[0]):
            if '(' in token:  # a method (``trainer.wake(hook)``), not state
                continue
            if token.startswith(('trainer.position.', 'trainer.step.')):
                names.add(token[len('trainer.'):])
            elif token.startswith('trainer.') or token.startswith('module.'):
                names.add(token)
            elif token.startswith('optimizer.param_groups'):
                keys = re.findall(r"'(\w+)'", token)
                names.update(f'param_group.{key}' for key in keys)
        writers = {path for path in re.findall(r'`(hookloop/[\w/]*(?:\.py|/))`', cells[2])}
        rows.append((names, writers))
    return rows


def allowed_writers():
    """``{traced name: {module names or package prefixes}}`` from the table; a name of the form
    ``trainer._*`` (the trainer's private attributes) is one row."""
    allowed = {}
    for names, writers in contract_rows():
        modules = {w[:-3].replace('/', '.') if w.endswith('.py') else w.replace('/', '.') for w in writers}
        for name in names:
            allowed.setdefault(name, set()).update(modules)
    return allowed


def violations(writes):
    allowed = allowed_writers()
    bad = []
    for name, writers in sorted(writes.items()):
        key = name
        if name.startswith('trainer._'):
            key = 'trainer._*'
        elif name.startswith('trainer.position.') or name.startswith('trainer.step.'):
            key = name[len('trainer.'):]
        permitted = allowed.get(key, set())
        for writer, where in writers.items():
            if writer in permitted or any(p.endswith('.') and writer.startswith(p) for p in permitted):
                continue
            bad.append(f'{name} written by {writer} ({where}); the table allows {sorted(permitted) or "nobody"}')
    return bad


# -- the runs ------------------------------------------------------------------------------
class MMCVStyleHead(nn.Module):
    """A submodule with MMCV's ``fp16_enabled`` switch (``auto_fp16`` methods would read it)."""

    def __init__(self):
        super().__init__()
        self.fp16_enabled = False
        self.scale = nn.Linear(1, 1)


class NaNAt(Regressor):
    """The training loss of the ``at``-th training forward (0-based) is NaN: the rollback acts."""

    def __init__(self, at):
        super().__init__()
        self.head, self.at, self.calls = MMCVStyleHead(), at, 0

    def forward(self, x, y=None):
        loss = super().forward(x, y)
        if y is not None and self.training:
            self.calls += 1
            if self.calls - 1 == self.at:
                return loss * float('nan')
        return loss


class SigtermAt(Hook):
    """Sends this process SIGTERM after iteration ``at`` (PreemptionHook stops and saves)."""

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            signal.raise_signal(signal.SIGTERM)


def loaders():
    return dict(train_dataloader=DataLoader(regression_data(), batch_size=4, shuffle=True),
                val_dataloader=DataLoader(regression_data(n=8, seed=1), batch_size=4),
                val_evaluator=lambda loss, batch: {'mse': loss})


def every_hook_by_iteration(work_dir, **kwargs):
    """Async checkpoints with save_best, EMA, evaluation, fp16 + accumulation + clipping, LR and
    momentum schedules with warm-up, timer, text / TensorBoard / progress loggers, the rollback
    policy of CheckInvalidLossHook (a NaN at the 6th iteration), PreemptionHook (SIGTERM)."""
    torch.manual_seed(0)
    return Trainer(NaNAt(at=5), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), **loaders(),
                   max_iters=16, work_dir=str(work_dir), seed=0, device='cpu', log_level='WARNING',
                   optimizer_config=dict(precision='fp16', cumulative_iters=2, grad_clip=dict(max_norm=1.0)),
                   lr_config=dict(policy='CosineAnnealing', min_lr=0.001, by_epoch=False, warmup='linear',
                                  warmup_iters=3),
                   momentum_config=dict(policy='CosineAnnealing', min_momentum_ratio=0.5, by_epoch=False),
                   checkpoint_config=dict(interval=4, by_epoch=False, max_keep_ckpts=2, save_best='mse', rule='less',
                                          async_save=True),
                   evaluation=dict(interval=4, by_epoch=False),
                   log_config=dict(interval=2, hooks=[dict(type='TextLoggerHook', by_epoch=False),
                                                      dict(type='TensorboardLoggerHook', by_epoch=False)]),
                   custom_hooks=[dict(type='EMAHook', interval=1, warm_up=1),
                                 dict(type='CheckInvalidLossHook', interval=2, on_invalid='rollback'),
                                 dict(type='ProgressBarHook', enabled=True, file=io.StringIO()),
                                 dict(type='PreemptionHook')], **kwargs)


def every_hook_by_epoch(work_dir, max_epochs=3, **kwargs):
    """Synchronous checkpoints with save_best by epoch, TorchSchedulerHook, the default
    FiniteLossGuard, IterTimerHook and TextLoggerHook, resumed from ``resume_from``."""
    torch.manual_seed(0)
    return Trainer(NaNAt(at=-1), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), **loaders(),
                   max_epochs=max_epochs, work_dir=str(work_dir), seed=0, device='cpu', log_level='WARNING',
                   checkpoint_config=dict(interval=1, max_keep_ckpts=1, save_best='mse', rule='less'),
                   evaluation=dict(interval=1),
                   log_config=dict(interval=3, hooks=[dict(type='TextLoggerHook')]),
                   custom_hooks=[dict(type='TorchSchedulerHook', scheduler=dict(type='StepLR', step_size=1, gamma=0.5)),
                                 dict(type='EMAHook', interval=2), SigtermAt(at=14)], **kwargs)


def traced_run(trainer):
    log = trace(trainer)
    train_and_close(trainer)
    return log.writes


@pytest.fixture(scope='module')
def writes(tmp_path_factory):
    work = tmp_path_factory.mktemp('contracts')
    seen = {}

    def merge(found):
        for name, writers in found.items():
            for writer, where in writers.items():
                seen.setdefault(name, {}).setdefault(writer, where)

    first = every_hook_by_iteration(work / 'by_iteration')
    merge(traced_run(first))
    assert first.outcome.finished and first.iter == 16
    stopped = every_hook_by_epoch(work / 'by_epoch')
    merge(traced_run(stopped))
    assert stopped.outcome.stopped and stopped.iter == 15
    resumed = every_hook_by_epoch(work / 'by_epoch', resume_from='auto')
    merge(traced_run(resumed))
    assert resumed.outcome.finished and resumed.resumed_from and resumed.iter == 30
    return seen


# -- the tests -----------------------------------------------------------------------------
def test_every_write_during_runs_with_every_built_in_hook_has_the_writer_the_table_names(writes):
    assert violations(writes) == []


def test_the_runs_exercise_the_contracts(writes):
    # the trace saw the writes the table is about (else the test above proves nothing)
    for name in ('position.iter', 'position.phase', 'position.val_iter', 'position.validations',
                 'step.forward_context', 'step.skip_reason', 'step.accumulation', 'step.loss_scaling',
                 'trainer.metrics', 'trainer.data_batch', 'trainer.val_outputs', 'trainer.mode',
                 'trainer.stop_reason', 'trainer.exception', 'trainer.resumed_from',
                 'param_group.lr', 'param_group.momentum', 'param_group.initial_lr', 'module.fp16_enabled'):
        assert name in writes, name


def test_a_hook_writing_shared_state_itself_is_caught(tmp_path):
    class Meddler(Hook):
        def after_train_iter(self, trainer):
            trainer.metrics = dict(trainer.metrics)
            trainer.position.validations += 1
            trainer.optimizer.param_groups[0]['lr'] = 0.5

    trainer = every_hook_by_epoch(tmp_path, max_epochs=1)
    trainer.register_hook(Meddler())
    found = violations(traced_run(trainer))
    assert any(v.startswith('trainer.metrics written by test_contracts') for v in found)
    assert any(v.startswith('position.validations written by test_contracts') for v in found)
    assert any(v.startswith('param_group.lr written by test_contracts') for v in found)


def test_every_traced_name_of_the_table_has_one_writer():
    rows = contract_rows()
    names = [name for row_names, _ in rows for name in row_names]
    assert len(names) == len(set(names)), 'a name appears in two rows'
    for row_names, writers in rows:
        if row_names:
            assert writers, f'{sorted(row_names)}: no writer module named'

