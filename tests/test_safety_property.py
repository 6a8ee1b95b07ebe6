"""A property test of the safety nets (issue 21): random short runs with a NaN/inf loss, NaN
gradients under a finite loss, or fp16 overflow bursts and dead fp16 runs, under random log and
checkpoint intervals (dividing the epoch or not), sync or async saves, with or without EMA,
accumulation, ``max_keep_ckpts`` and ``save_best``. After every run: every checkpoint on disk is
finite, ``last_checkpoint`` and the best file name finite files, retention deleted no file it
should keep, and a dead run stopped soon after its first bad value.

Each case is a tiny model for a handful of iterations, in this process."""
import logging
import math
import os
import random

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookloop.checkpoint.atomic as atomic_module
from hookloop import Trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import InvalidLossError
from hookloop.checkpoint.finite_state import non_finite_entries

CASES = 200
KINDS = ('none', 'loss_nan', 'loss_inf', 'grad_nan', 'fp16_burst', 'fp16_dead')
BATCH = 2
MAX_SKIPPED = 3


class Tiny(nn.Module):
    """A linear model; ``faults[k]`` (0-based forward number) says what goes wrong there."""

    def __init__(self, faults):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.faults, self.calls = faults, 0

    def forward(self, x, y=None):
        prediction = self.linear(x)
        if y is None or not self.training:  # validation forwards do not count
            return nn.functional.mse_loss(prediction, y) if y is not None else prediction
        fault, self.calls = self.faults.get(self.calls), self.calls + 1
        if fault == 'overflow':  # under fp16 autocast: an inf prediction, an inf loss
            prediction = self.linear(x * 1e30)
        loss = nn.functional.mse_loss(prediction.float(), y)
        if fault == 'loss_nan':
            loss = loss * math.nan
        elif fault == 'loss_inf':
            loss = loss * math.inf
        elif fault == 'grad_nan':  # finite loss, NaN gradient (sqrt at 0)
            loss = loss + torch.sqrt(self.linear.weight.sum() * 0.0)
        return loss


def draw(rng):
    epoch_length, epochs = rng.choice([3, 4, 5]), rng.choice([2, 3])
    total = epoch_length * epochs
    kind = rng.choice(KINDS)
    first = rng.randrange(total)  # 0-based forward number of the first bad value
    faults = {}
    if kind in ('loss_nan', 'loss_inf', 'grad_nan'):
        faults[first] = kind
    elif kind == 'fp16_burst':
        faults.update({k: 'overflow' for k in range(first, min(total, first + rng.randint(1, MAX_SKIPPED - 1)))})
    elif kind == 'fp16_dead':
        faults.update({k: 'overflow' for k in range(first, total)})
    return dict(epoch_length=epoch_length, epochs=epochs, total=total, kind=kind, first=first, faults=faults,
                log_interval=rng.randint(1, 6), ckpt_interval=rng.randint(1, 6), by_epoch=rng.random() < 0.3,
                async_save=rng.random() < 0.5, ema=rng.random() < 0.4, cumulative=rng.choice([1, 1, 2]),
                max_keep=rng.choice([-1, 1, 2]), save_best=rng.random() < 0.3,
                metrics=[rng.random() for _ in range(epochs)])


def next_event(start, total, due):
    """The first 1-based iteration >= start (and <= total) for which ``due(it)``; else total."""
    for it in range(max(start, 1), total + 1):
        if due(it):
            return it
    return total


def run_case(tmp_path, case, written):
    torch.manual_seed(0)
    n = case['epoch_length'] * BATCH
    data = TensorDataset(torch.randn(n, 2), torch.randn(n, 1))
    fp16 = case['kind'].startswith('fp16')
    checkpoint = dict(interval=case['ckpt_interval'] if not case['by_epoch'] else 1, by_epoch=case['by_epoch'],
                      max_keep_ckpts=case['max_keep'], async_save=case['async_save'])
    extra = {}
    if case['save_best']:
        checkpoint['save_best'] = 'acc'
        metrics = iter(case['metrics'])
        extra = dict(val_dataloader=DataLoader(TensorDataset(torch.randn(2, 2), torch.randn(2, 1)), batch_size=2),
                     val_evaluator=lambda outputs, batch: {'acc': next(metrics)}, evaluation=dict(interval=1))
    hooks = [dict(type='FiniteLossGuard', max_skipped_steps=MAX_SKIPPED)]
    if case['ema']:
        hooks.append(dict(type='EMAHook', momentum=0.5, warm_up=1))
    trainer = Trainer(Tiny(case['faults']), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(data, batch_size=BATCH), max_epochs=case['epochs'],
                      work_dir=tmp_path, seed=0, device='cpu', log_level='WARNING',
                      log_config=dict(interval=case['log_interval'], hooks=[dict(type='TextLoggerHook')]),
                      optimizer_config=dict(precision='fp16' if fp16 else None, cumulative_iters=case['cumulative'],
                                            loss_scale=dict(init_scale=256.0) if fp16 else None),  # no overflow of its own
                      checkpoint_config=checkpoint, custom_hooks=hooks, **extra)
    error = None
    try:
        trainer.train()
    except InvalidLossError as exc:
        error = exc
    finally:
        trainer.close()
    best = next(h for h in trainer.hooks if type(h).__name__ == 'CheckpointHook').best
    return trainer, error, best


def window_ends(case, start):
    """The 1-based iterations >= start at which an optimizer step is due (accumulation windows
    restart every epoch)."""
    length, cumulative = case['epoch_length'], case['cumulative']
    return [it for it in range(start, case['total'] + 1)
            if ((it - 1) % length + 1) % cumulative == 0 or (it - 1) % length + 1 == length]


def is_dead(case):
    if case['kind'] == 'fp16_dead':  # dead once MAX_SKIPPED steps in a row were skipped
        return len(window_ends(case, case['first'] + 1)) >= MAX_SKIPPED
    return case['kind'] in ('loss_nan', 'loss_inf', 'grad_nan')


def stop_bound(case):
    """The latest iteration count a dead run may reach: the guard looks at every log event,
    epoch end and save (and the finite-state check at every save) from the first bad value
    on, and acts in that iteration or the next one. Log events and epoch ends are never more
    than one log interval apart."""
    total, length, first = case['total'], case['epoch_length'], case['first'] + 1  # 1-based
    kind = case['kind']
    if kind == 'grad_nan':  # the weights go bad at the step of the window holding ``first``
        saves_from = window_ends(case, first)[0]
        bad_from = saves_from + 1  # the first non-finite loss
    elif kind == 'fp16_dead':  # the state stays finite: only the guard stops it
        bad_from, saves_from = window_ends(case, first)[MAX_SKIPPED - 1], None
    else:
        bad_from = saves_from = first
    look = next_event(bad_from, total, lambda it: ((it - 1) % length + 1) % case['log_interval'] == 0
                      or it % length == 0)
    assert look - bad_from < case['log_interval'] or look == total
    bound = look
    if saves_from is not None:
        save_due = (lambda it: it % length == 0) if case['by_epoch'] else (lambda it: it % case['ckpt_interval'] == 0)
        bound = min(bound, next_event(saves_from, total, save_due))
    return min(bound + 1, total)


@pytest.mark.parametrize('seed', range(CASES))
def test_random_runs_never_keep_a_bad_state_nor_drop_a_good_one(tmp_path, monkeypatch, seed):
    case = draw(random.Random(seed))
    written = []  # every checkpoint file committed, in order
    original = atomic_module.commit

    def commit(tmp_path_, path):
        original(tmp_path_, path)
        if path.endswith('.pth'):
            written.append(path)
    monkeypatch.setattr(atomic_module, 'commit', commit)
    logging.getLogger('hookloop').setLevel(logging.WARNING)
    trainer, error, best = run_case(tmp_path, case, written)
    fp16 = case['kind'].startswith('fp16')

    names = sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth'))
    for name in names:
        assert non_finite_entries(load_checkpoint(str(tmp_path / name)), scaled_grads=fp16) == [], (name, case)
    latest = read_pointer(tmp_path)
    interval_files = [p for p in written if not os.path.basename(p).startswith('best_')]
    if interval_files:
        assert latest == interval_files[-1] and os.path.exists(latest), case  # the newest finite file
        kept = [n for n in names if not n.startswith('best_')]
        expected = len(interval_files) if case['max_keep'] < 0 else min(case['max_keep'], len(interval_files))
        assert len(kept) >= expected, (kept, case)  # retention deleted nothing it should keep
    else:
        assert latest is None
    if best is not None and best.path is not None and error is None:
        assert os.path.exists(best.path), case
    best_files = [n for n in names if n.startswith('best_')]
    assert len(best_files) <= 1, best_files

    kind = case['kind']
    dead = is_dead(case)
    if not dead:
        assert error is None, (error, case)
        assert trainer.iter == case['total']
    elif error is None:  # the first bad value came too late to be acted on before the end
        pytest.fail(f'a dead run ended without an error: {case}')
    else:
        assert trainer.iter <= stop_bound(case), (trainer.iter, stop_bound(case), str(error), case)
