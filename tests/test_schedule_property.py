"""Differential property test of the iteration schedule (issue 22), over random configurations.

Each case draws a tiny run: random built-in hooks with random intervals (dividing the epoch or
not), random user subclasses of them overriding random stages (specific and generic) and
extension methods, MMCV-style user hooks (``every_n_iters`` / ``every_n_epochs`` /
``end_of_epoch``, with and without a ``next_call``), random ``wake``s, a random
``request_stop`` followed by ``train()`` again and a random resume. It runs twice, scheduled
and with every hook called at every iteration, and the two must leave the same calls with an
effect (what the user hooks record), the same logs, the same checkpoint files and bitwise-equal
state. Both runs share the scheduler's blind spots, so each case is also compared with an
uninterrupted run (same results after stop + ``train()`` again) and the learning rate of every
iteration with MMCV 1.x's ``LrUpdaterHook`` formulas, written out below.
"""
import functools
import glob
import json
import math
import os
import random

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from resume_helpers import StopAt
from hookloop import Hook, Trainer
from hookloop.hooks import (NEVER, CheckInvalidLossHook, CheckpointHook, EMAHook, EvaluationHook,
                            TextLoggerHook)
from hookloop.hooks.lr_updater import CosineAnnealingLrUpdaterHook, FixedLrUpdaterHook, StepLrUpdaterHook
from test_iteration_schedule import assert_same_tree, relative, unscheduled

CASES = 300
pytestmark = pytest.mark.filterwarnings("ignore::hookloop.hooks.order.HookOrderWarning")
BATCH = 2


# -- what a case is made of ------------------------------------------------------------------------
def draw(seed):
    """A case: plain data (each run builds its own hooks from it)."""
    rng = random.Random(seed)
    length, epochs = rng.randint(3, 6), rng.randint(2, 3)
    case = dict(seed=seed, length=length, epochs=epochs, max_iters=None, hooks=[], user=[], wakes=[],
                cumulative=rng.choice([1, 1, 2, 3]), stop=None, resume=None)
    total = length * epochs
    if rng.random() < 0.25:
        case['max_iters'] = total = total - rng.randint(1, length - 1)
    interval = lambda: rng.randint(1, length + 2)  # noqa: E731 -- dividing the epoch or not
    if rng.random() < 0.8:
        case['hooks'].append(('logger', dict(interval=interval(), by_epoch=rng.random() < 0.5,
                                             ignore_last=rng.random() < 0.5)))
    if rng.random() < 0.6:
        case['hooks'].append(('checkpoint', dict(interval=interval(), by_epoch=rng.random() < 0.5,
                                                 save_last=rng.random() < 0.5, max_keep_ckpts=rng.choice([-1, 1, 2]))))
    if rng.random() < 0.5:
        case['hooks'].append(('evaluation', dict(interval=interval(), by_epoch=rng.random() < 0.5,
                                                 start=rng.choice([None, None, rng.randint(0, 4)]))))
    if rng.random() < 0.4:
        case['hooks'].append(('ema', dict(interval=rng.randint(1, 4), warm_up=rng.randint(1, 3))))
    if rng.random() < 0.3:
        case['hooks'].append(('invalid_loss', dict(interval=rng.randint(1, 3))))
    if rng.random() < 0.75:
        policy = rng.choice(['fixed', 'step', 'cosine', 'yolox'])
        lr = dict(policy=policy, by_epoch=policy != 'yolox' and rng.random() < 0.5,
                  warmup=rng.choice([None, 'constant', 'linear', 'exp']), warmup_ratio=rng.choice([0.1, 0.5]),
                  warmup_by_epoch=rng.random() < 0.3)
        lr['warmup_iters'] = rng.randint(1, 2) if lr['warmup_by_epoch'] else rng.randint(1, 2 * length)
        if policy == 'step':
            lr.update(step=sorted(rng.sample(range(1, total), 2)), gamma=0.5)
        if policy in ('cosine', 'yolox'):
            lr.update(min_lr_ratio=0.05)
        if policy == 'yolox':
            lr.update(warmup='exp', warmup_ratio=1, num_last_epochs=1, warmup_by_epoch=False,
                      warmup_iters=rng.randint(1, length - 1))
            if total - lr['warmup_iters'] - length <= 0:  # no cosine part left: YOLOX divides by zero
                lr['policy'] = 'cosine'
                del lr['num_last_epochs']
        case['hooks'].append(('lr', lr))
    # user subclasses of the chosen built-in hooks: random overrides, specific, generic, extension
    extensions = dict(logger=['log', 'should_log'], lr=['get_lr', 'get_regular_lr', 'get_warmup_lr'],
                      checkpoint=['before_val_epoch'], ema=['before_val_epoch'], evaluation=['before_val_epoch'],
                      invalid_loss=[])
    for kind, _ in case['hooks']:
        if rng.random() < 0.4:
            names = ['before_iter', 'after_iter', 'before_train_iter', 'after_train_iter'] + extensions[kind]
            chosen = rng.sample(names, rng.randint(1, 3))
            scale = dict(regular=rng.choice([1.0, 0.5]), warmup=rng.choice([1.0, 2.0])) if kind == 'lr' else None
            case['user'].append((kind, chosen, scale))
    # MMCV-style user hooks
    for n in range(rng.randint(0, 3)):
        case['hooks'].append(('mmcv', dict(label=f'u{n}', test=rng.choice(['iters', 'epochs', 'end', 'inner']),
                                           n=rng.randint(1, length + 1), stage=rng.choice(['before', 'after']),
                                           own_next_call=rng.random() < 0.5)))
    if rng.random() < 0.5:
        case['wakes'] = sorted(rng.sample(range(total), rng.randint(1, 3)))
        case['sleeper_stage'] = rng.choice(['before', 'after'])
        case['sleeper_first'] = rng.random() < 0.5
    if rng.random() < 0.4:
        case['stop'] = rng.randint(0, total - 2)
    if rng.random() < 0.25:
        case['resume'] = rng.randint(1, total - 1)  # iterations done by the run resumed from
        if case['stop'] is not None and case['stop'] < case['resume']:
            case['stop'] = None
    # issue 38: how each stage override is made, and re-plans by another hook (drawn apart, so the
    # cases above stay what they were)
    more = random.Random(seed + 1_000_003)
    built_in = [kind for kind, _ in case['hooks'] if kind in extensions]
    if built_in and more.random() < 0.5:  # an iteration stage overridden, in one of the ways below
        kind, stage = more.choice(built_in), more.choice(['before_train_iter', 'after_train_iter'])
        user = {k: (names, scale) for k, names, scale in case['user']}
        names, scale = user.get(kind, ([], None))
        user[kind] = (sorted(set(names) | {stage}), scale)
        case['user'] = [(k, names, scale) for k, (names, scale) in user.items()]
    case['override_kinds'] = {kind: more.choice(OVERRIDE_KINDS) for kind, _, _ in case['user']}
    # targets: (label, counted in epochs' inner iterations)
    targets = [('logger', args['by_epoch']) for kind, args in case['hooks'] if kind == 'logger'] + [
        (args['label'], args['test'] == 'inner') for kind, args in case['hooks']
        if kind == 'mmcv' and args['test'] in ('iters', 'inner')]
    case['replans'] = []
    if targets and more.random() < 0.6:
        for at in sorted(more.sample(range(total), more.randint(1, 3))):
            label, inner = more.choice(targets)
            due_now = at % length + 1 if inner else at + 1  # an interval that makes it due at once
            case['replans'].append((at, label, more.choice([more.randint(1, length + 1), due_now])))
        case['replanner'] = dict(stage=more.choice(['before', 'after']),
                                 priority=more.choice(['HIGHEST', 'NORMAL', 'LOWEST']))
    return case


# the ways a user's class (or instance) puts a method at a stage
OVERRIDE_KINDS = ('def', 'partialmethod', 'singledispatchmethod', 'staticmethod', 'instance')
STAGE_NAMES = ('before_iter', 'after_iter', 'before_train_iter', 'after_train_iter', 'before_val_epoch')


class Recorder:
    """The calls with an effect, in order: (who, what, iteration)."""

    def __init__(self):
        self.events = []

    def __call__(self, who, what, trainer):
        self.events.append((who, what, trainer.iter))


def user_subclass(base, label, names, scale, record, how='def'):
    """``base`` with ``names`` overridden: each records its call, then does what the base does
    (an LR override may also scale the values, which the formula check accounts for). ``how``
    makes the stage overrides: a ``def``, a ``functools.partialmethod`` / ``singledispatchmethod``
    / ``staticmethod``, or (``'instance'``) methods :func:`set_instance_overrides` puts on the hook."""
    body = {}

    def stage(name):
        def method(self, trainer):
            record(label, name, trainer)
            getattr(super(cls, self), name)(trainer)
        return method

    def by_name(self, name, trainer):
        record(label, name, trainer)
        getattr(super(cls, self), name)(trainer)

    def static(name):  # no self: the base's method through the hook the trainer is calling
        def method(trainer):
            record(label, name, trainer)
            hook = next(h for h in trainer.hooks if type(h) is cls)
            getattr(super(cls, hook), name)(trainer)
        return staticmethod(method)
    for name in names:
        if name in STAGE_NAMES:
            if how == 'instance':
                continue
            body[name] = {'def': lambda: stage(name), 'partialmethod': lambda: functools.partialmethod(by_name, name),
                          'singledispatchmethod': lambda: functools.singledispatchmethod(stage(name)),
                          'staticmethod': lambda: static(name)}[how]()
        elif name == 'log':
            body[name] = lambda self, trainer, record_: (record(label, 'log', trainer),
                                                         super(cls, self).log(trainer, record_))[1]
        elif name == 'should_log':
            body[name] = lambda self, trainer: (record(label, 'should_log', trainer),
                                                super(cls, self).should_log(trainer))[1]
        elif name == 'get_lr':
            body[name] = lambda self, trainer, base_lr: (record(label, 'get_lr', trainer),
                                                         super(cls, self).get_lr(trainer, base_lr))[1]
        elif name == 'get_regular_lr':
            body[name] = lambda self, trainer: (record(label, 'get_regular_lr', trainer), [
                lr * scale['regular'] for lr in super(cls, self).get_regular_lr(trainer)])[1]
        elif name == 'get_warmup_lr':
            body[name] = lambda self, cur_iters: [lr * scale['warmup'] for lr in super(cls, self).get_warmup_lr(cur_iters)]
    cls = type(f'User{base.__name__}', (base,), body)
    return cls


def set_instance_overrides(hook, label, names, record):
    """The stage overrides of ``names`` set on the hook instance (``hook.after_train_iter = fn``)."""
    for name in names:
        if name in STAGE_NAMES:
            inherited = getattr(type(hook), name)

            def method(trainer, name=name, inherited=inherited):
                record(label, name, trainer)
                inherited(hook, trainer)
            setattr(hook, name, method)


class YOLOXLike(CosineAnnealingLrUpdaterHook):
    """mmdet's YOLOX LR hook (its get_warmup_lr / get_lr overrides), reduced."""

    def __init__(self, num_last_epochs, **kwargs):
        self.num_last_epochs = num_last_epochs
        super().__init__(**kwargs)

    def get_warmup_lr(self, cur_iters):
        k = self.warmup_ratio * pow((cur_iters + 1) / float(self.warmup_iters), 2)
        return [lr * k for lr in self.base_lr]

    def get_lr(self, trainer, base_lr):
        return yolox_lr(base_lr, trainer.iter, trainer.max_iters, trainer.epoch_length * self.num_last_epochs,
                        self.warmup_iters, self.min_lr_ratio)


def yolox_lr(base, it, max_iters, last, warmup_iters, min_ratio):
    target, progress = base * min_ratio, it + 1
    if progress >= max_iters - last:
        return target
    ratio = (progress - warmup_iters) / (max_iters - warmup_iters - last)
    return target + 0.5 * (base - target) * (math.cos(math.pi * ratio) + 1)


def mmcv_act(self, trainer):
    """Record at the iterations MMCV's interval helpers name."""
    due = {'iters': lambda: self.every_n_iters(trainer, self.n),
           'inner': lambda: self.every_n_inner_iters(trainer, self.n),
           'epochs': lambda: self.every_n_epochs(trainer, self.n),
           'end': lambda: self.end_of_epoch(trainer)}[self.test]()
    if due:
        self.record(self.label, self.test, trainer)


def mmcv_style(label, test, n, stage, own_next_call, record):
    """A user hook class per case (the stage it implements is chosen at random)."""
    body = {f'{stage}_train_iter': mmcv_act}
    if own_next_call:
        def next_call(self, trainer, stage_, start):
            if self.test == 'iters':
                return self.next_every_n_iters(start, self.n)
            if self.test == 'inner':
                return self.next_every_n_inner_iters(trainer, start, self.n)
            if self.test == 'end':
                end = self.epoch_end_iter(trainer)
                return end if end >= start else NEVER
            return start if self.every_n_epochs(trainer, self.n) else NEVER
        body['next_call'] = next_call
    cls = type(f'MMCV{label}', (Hook,), body)
    hook = cls.__new__(cls)
    hook.label, hook.test, hook.n, hook.record = label, test, n, record
    return hook


def build(case, work_dir, record, stop=True, resume_from=None):
    torch.manual_seed(case['seed'])
    n = BATCH * case['length']
    kwargs = dict(max_iters=case['max_iters']) if case['max_iters'] else dict(max_epochs=case['epochs'])
    has_val = any(kind == 'evaluation' for kind, _ in case['hooks'])
    if has_val:
        kwargs.update(val_dataloader=DataLoader(regression_data(n=2, features=2, seed=1), batch_size=2),
                      val_evaluator=lambda loss, batch: {'mse': loss})
    trainer = Trainer(Regressor(features=2, hidden=3), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(regression_data(n=n, features=2, seed=case['seed']),
                                                  batch_size=BATCH, shuffle=True),
                      optimizer_config=dict(cumulative_iters=case['cumulative']), work_dir=str(work_dir),
                      seed=case['seed'], device='cpu', log_level='WARNING', resume_from=resume_from, **kwargs)
    overrides = {kind: (names, scale) for kind, names, scale in case['user']}
    classes = dict(logger=TextLoggerHook, checkpoint=CheckpointHook, evaluation=EvaluationHook, ema=EMAHook,
                   invalid_loss=CheckInvalidLossHook)
    for kind, args in case['hooks']:
        if kind == 'mmcv':
            trainer.register_hook(mmcv_style(**args, record=record))
            continue
        args = dict(args)
        if kind == 'lr':
            base = dict(fixed=FixedLrUpdaterHook, step=StepLrUpdaterHook, cosine=CosineAnnealingLrUpdaterHook,
                        yolox=YOLOXLike)[args.pop('policy')]
        else:
            base = classes[kind]
        how = case.get('override_kinds', {}).get(kind, 'def')
        if kind in overrides:
            base = user_subclass(base, kind, *overrides[kind], record, how)
        hook = base(**args)
        if kind in overrides and how == 'instance':
            set_instance_overrides(hook, kind, overrides[kind][0], record)
        trainer.register_hook(hook)
    if case['wakes']:
        sleeper = Sleeper(case['sleeper_stage'], record)
        trainer.register_hook(sleeper, priority='HIGHEST' if case['sleeper_first'] else 'LOWEST')
        trainer.register_hook(Waker(sleeper, case['wakes']), priority='NORMAL')
    if case.get('replans'):
        targets = {label: hook for hook in trainer.hooks
                   for label in ([getattr(hook, 'label', None)] + ['logger'] * isinstance(hook, TextLoggerHook))}
        trainer.register_hook(Replanner(case['replanner']['stage'], case['replans'], targets),
                              priority=case['replanner']['priority'])
    trainer.register_hook(LrSeen())
    if stop and case['stop'] is not None:
        trainer.register_hook(StopAt(case['stop']))
    return trainer


class Sleeper(Hook):
    """Due nowhere by itself; acts at its first call in an iteration after a wake (a wake's
    promise: a call at the latest in the next iteration)."""

    def __init__(self, stage, record):
        self.woken_at, self.record = None, record
        setattr(self, f'{stage}_train_iter', self._act)

    def next_call(self, trainer, stage, start):
        return NEVER

    def _act(self, trainer):
        if self.woken_at is not None and trainer.iter > self.woken_at:
            self.woken_at = None
            self.record('sleeper', 'woken', trainer)

    def after_train_iter(self, trainer):
        pass

    def before_train_iter(self, trainer):
        pass


class Replanner(Hook):
    """Another hook's re-plan (issue 38 item 4): at the drawn iterations, called at every
    iteration, it sets a target's interval (a logger's ``interval``, an MMCV-style hook's ``n``)
    and calls ``trainer.replan(target)``; the scheduled run must then call the target where the
    run that calls every hook at every iteration does."""

    def __init__(self, stage, replans, targets):
        self.replans = {at: (targets[label], value) for at, label, value in replans}
        setattr(self, f'{stage}_train_iter', self._act)

    def next_call(self, trainer, stage, start):
        return None

    def _act(self, trainer):
        if trainer.iter in self.replans:
            target, value = self.replans[trainer.iter]
            setattr(target, 'interval' if isinstance(target, TextLoggerHook) else 'n', value)
            trainer.replan(target)

    def before_train_iter(self, trainer):
        pass

    def after_train_iter(self, trainer):
        pass


class Waker(Hook):
    def __init__(self, sleeper, at):
        self.sleeper, self.at = sleeper, set(at)

    def after_train_iter(self, trainer):
        if trainer.iter in self.at:
            if self.sleeper.woken_at is None:
                self.sleeper.woken_at = trainer.iter
            trainer.wake(self.sleeper)


class LrSeen(Hook):
    PRIORITY = 'LOWEST'

    def __init__(self):
        self.lrs = {}

    def before_train_iter(self, trainer):
        self.lrs[trainer.iter] = trainer.optimizer.param_groups[0]['lr']


def run(case, work_dir, stop=True, resume_from=None):
    record = Recorder()
    trainer = build(case, work_dir, record, stop, resume_from)
    try:
        trainer.train()
        if trainer.stop_reason is not None and trainer.iter < trainer.max_iters:
            trainer.train()  # train() again: continues where the stop left it
    finally:
        trainer.close()
    assert trainer.iter == trainer.max_iters
    lrs = next(h for h in trainer.hooks if isinstance(h, LrSeen)).lrs
    return trainer, record.events, lrs


def outcome(work_dir, trainer):
    records = []
    for path in sorted(glob.glob(os.path.join(work_dir, '*.log.json'))):
        with open(path, encoding='utf-8') as f:
            records += [json.loads(line) for line in f]
    records = [{k: v for k, v in r.items() if k not in ('time', 'data_time')} for r in records if 'mode' in r]
    files = sorted(name for name in os.listdir(work_dir) if name.endswith('.pth') or name == 'last_checkpoint')
    state = trainer.state_dict()
    del state['meta']['time'], state['meta']['run'], state['rng']  # wall-clock times
    return records, files, relative(state, str(work_dir))


# -- MMCV 1.x's learning rates, written out ------------------------------------------------------------
def mmcv_lrs(case, lr_args, scale, trainer, base=0.05):
    """{iteration: lr} as MMCV's LrUpdaterHook sets it (before_train_epoch / before_train_iter)."""
    args = dict(lr_args)
    policy, by_epoch, warmup, ratio = args['policy'], args['by_epoch'], args['warmup'], args['warmup_ratio']
    length, max_iters, max_epochs = case['length'], trainer.max_iters, trainer.max_epochs
    warmup_iters = args['warmup_iters'] * length if args['warmup_by_epoch'] else args['warmup_iters']
    scale = scale or dict(regular=1.0, warmup=1.0)

    def get_lr(progress, max_progress, it):
        if policy == 'fixed':
            return base
        if policy == 'step':
            return base * args['gamma'] ** sum(1 for milestone in args['step'] if progress >= milestone)
        if policy == 'cosine':
            target = base * args['min_lr_ratio']
            return target + 0.5 * (base - target) * (math.cos(math.pi * progress / max_progress) + 1)
        return yolox_lr(base, it, max_iters, length * args['num_last_epochs'], warmup_iters, args['min_lr_ratio'])

    def warmup_lr(it, regular):
        if policy == 'yolox':
            value = base * ratio * ((it + 1) / warmup_iters) ** 2
        elif warmup == 'constant':
            value = regular * ratio
        elif warmup == 'linear':
            value = regular * (1 - (1 - it / warmup_iters) * (1 - ratio))
        else:
            value = regular * ratio ** (1 - it / warmup_iters)
        return value * scale['warmup']

    lrs = {}
    for it in range(max_iters):
        epoch = it // length
        if by_epoch:
            regular = get_lr(epoch, max_epochs, it) * scale['regular']
            lrs[it] = regular if warmup is None or it >= warmup_iters else warmup_lr(it, regular)
        else:
            regular = get_lr(it, max_iters, it) * scale['regular']
            lrs[it] = regular if warmup is None or it >= warmup_iters else warmup_lr(it, regular)
    return lrs


@pytest.fixture
def no_fsync(monkeypatch):
    monkeypatch.setattr(os, 'fsync', lambda fd: None)  # durability is not what this test checks; speed is


@pytest.mark.parametrize('seed', range(CASES))
def test_scheduled_and_every_iteration_runs_agree(tmp_path, monkeypatch, no_fsync, seed):
    case = draw(seed)
    resume_from = None
    if case['resume'] is not None:  # a run stopped after case['resume'] iterations, saved, resumed from
        prefix_case = dict(case, stop=case['resume'] - 1, wakes=[])
        record = Recorder()
        prefix = build(prefix_case, tmp_path / 'prefix', record)
        try:
            prefix.train()
            resume_from = prefix.save_checkpoint(str(tmp_path / 'resume.pth'), update_last=False)
        finally:
            prefix.close()
    scheduled, events, lrs = run(case, tmp_path / 'scheduled', resume_from=resume_from)
    with monkeypatch.context() as patch:
        unscheduled(patch)
        every, every_events, every_lrs = run(case, tmp_path / 'every', resume_from=resume_from)
    a, b = outcome(tmp_path / 'scheduled', scheduled), outcome(tmp_path / 'every', every)
    assert events == every_events
    assert a[0] == b[0]  # the log records
    assert a[1] == b[1]  # the checkpoint files
    assert_same_tree(a[2], b[2])
    assert lrs == every_lrs
    if case['stop'] is not None:  # stop + train() again == the run without the stop
        whole, whole_events, whole_lrs = run(case, tmp_path / 'whole', stop=False, resume_from=resume_from)
        c = outcome(tmp_path / 'whole', whole)
        # train() again runs before_run and the epoch's before_train_epoch again (as a resume
        # does): the extension methods called there (by-epoch get_lr) are compared by their values
        at_start = ('get_lr', 'get_regular_lr')
        assert [e for e in events if e[1] not in at_start] == [e for e in whole_events if e[1] not in at_start]
        assert a[1] == c[1]
        assert_same_tree(a[2]['state_dict'], c[2]['state_dict'], 'state_dict')
        assert_same_tree(a[2]['optimizer'], c[2]['optimizer'], 'optimizer')
        assert_same_tree(a[2].get('hooks'), c[2].get('hooks'), 'hooks')
        assert lrs == whole_lrs
    lr = next((args for kind, args in case['hooks'] if kind == 'lr'), None)
    if lr is not None:
        scale = next((s for kind, _, s in case['user'] if kind == 'lr'), None)
        names = next((n for kind, n, _ in case['user'] if kind == 'lr'), ())
        scale = dict(regular=scale['regular'] if 'get_regular_lr' in names else 1.0,
                     warmup=scale['warmup'] if 'get_warmup_lr' in names else 1.0) if scale else None
        expected = mmcv_lrs(case, lr, scale, scheduled)
        assert lrs.keys() == set(range(case['resume'] or 0, scheduled.max_iters))
        for it, value in lrs.items():
            assert value == pytest.approx(expected[it], rel=1e-12, abs=1e-15), (it, case)
