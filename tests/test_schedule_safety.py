"""The schedule never skips a call that has work (issue 22): user subclasses of built-in hooks
(generic stages, extension methods), optimizer processors, MMCV's LR/momentum extension points,
intervals that change during a run, a wake at an epoch's last iteration, a second train() and
set-up of a hook that reuses a freed one's id. Expected values are MMCV's documented behaviour
(formulas written out here), not what the code produces."""
import bisect
import math

import pytest
import torch

import hookloop.engine.trainer
from conftest import train_and_close
from resume_helpers import StopAt
from hookloop import ConfigError, Hook, HOOKS
from hookloop.hooks import NEVER, CheckpointHook, EMAHook, EvaluationHook, TextLoggerHook
from hookloop.hooks.lr_updater import FixedLrUpdaterHook, StepLrUpdaterHook
from hookloop.hooks.momentum_updater import MomentumUpdaterHook
from hookloop.hooks.optimizer import OptimizerHook, OptimizerProcessor
from test_iteration_schedule import Sleeper, Waker, make  # make: 40 samples, batch 4: 10 iterations per epoch
from test_schedule_property import YOLOXLike

LR = 0.05  # make()'s SGD learning rate


class LrSeen(Hook):
    """Runs last in before_train_iter: the learning rate this iteration's step uses."""
    PRIORITY = 'LOWEST'

    def __init__(self):
        self.lrs, self.momenta = [], []

    def before_train_iter(self, trainer):
        self.lrs.append(trainer.optimizer.param_groups[0]['lr'])
        self.momenta.append(trainer.optimizer.param_groups[0]['momentum'])


# -- 1. a built-in hook's subclass that adds MMCV's generic stages ---------------------------------
def counting(base):
    class Counting(base):
        def before_iter(self, trainer):
            self.seen.append(('before', trainer.iter))

        def after_iter(self, trainer):
            self.seen.append(('after', trainer.iter))
            super().after_iter(trainer)
    Counting.__name__ = f'Counting{base.__name__}'
    return Counting


# As in MMCV, a generic stage runs where the class does not define the specific one (the
# base's after_train_iter replaces after_iter): checkpoint, EMA and logger hooks reach their
# before_iter, the LR hook (a before_train_iter of its own) its after_iter.
@pytest.mark.parametrize('base,kwargs,reached', [
    (CheckpointHook, dict(interval=1), 'before'), (EMAHook, dict(interval=5), 'before'),
    (TextLoggerHook, dict(interval=5), 'before'), (StepLrUpdaterHook, dict(step=[1]), 'after')],
    ids=['checkpoint', 'ema', 'logger', 'step_lr'])
def test_a_builtin_subclass_with_generic_iteration_stages_is_called_at_every_iteration(tmp_path, base, kwargs,
                                                                                       reached):
    hook = counting(base)(**kwargs)
    hook.seen = []
    trainer = make(tmp_path)
    trainer.register_hook(hook)
    train_and_close(trainer)
    assert [it for stage, it in hook.seen if stage == reached] == list(range(20))
    assert not [it for stage, it in hook.seen if stage != reached]


def test_a_subclass_overriding_only_what_its_schedule_knows_stays_scheduled(tmp_path):
    """No needless per-iteration calls: a logger's ``log`` and a stage outside the iteration."""
    calls = []

    class QuietLogger(TextLoggerHook):
        def log(self, trainer, record):
            calls.append(record['iter'])

        def before_val_epoch(self, trainer):
            pass

    trainer = make(tmp_path)
    trainer.register_hook(QuietLogger(interval=5, by_epoch=False))
    trainer.resolve_hooks()
    stage = trainer._iteration_stages['after_train_iter']
    train_and_close(trainer)
    assert calls == [5, 10, 15, 20]
    assert not any(getattr(m, '__self__', None).__class__ is QuietLogger for m in stage.every)


# -- 2. an OptimizerProcessor subclass ----------------------------------------------------------------
def test_an_optimizer_processor_subclass_overriding_before_forward_is_called_every_iteration(tmp_path):
    seen = []

    class Processor(OptimizerProcessor):
        def before_forward(self, trainer, cumulative_iters=1):
            seen.append(trainer.iter)
            super().before_forward(trainer, cumulative_iters)

    trainer = make(tmp_path, epochs=1)
    trainer.resolve_hooks()
    next(h for h in trainer.hooks if isinstance(h, OptimizerHook)).set_processor(Processor())
    train_and_close(trainer)
    assert seen == list(range(10))


# -- 3. MMCV's LR / momentum extension points ----------------------------------------------------------
@HOOKS.register_module(force=True)
class YOLOXLikeLrUpdaterHook(YOLOXLike):
    """mmdet's YOLOX hook, reduced (test_schedule_property's), registered so a config can name it."""


def test_an_lr_subclass_overriding_get_warmup_lr_and_get_lr_gets_mmcv_values(tmp_path):
    seen = LrSeen()
    trainer = make(tmp_path, epochs=3, custom_hooks=[dict(
        type='YOLOXLikeLrUpdaterHook', by_epoch=False, warmup='exp', warmup_by_epoch=True, warmup_iters=1,
        warmup_ratio=1, min_lr_ratio=0.05, num_last_epochs=1)])
    trainer.register_hook(seen)
    train_and_close(trainer)
    lr_hook = next(h for h in trainer.hooks if isinstance(h, YOLOXLikeLrUpdaterHook))
    assert lr_hook.warmup_iters == 10 and lr_hook.warmup_epochs == 1  # MMCV: warmup_iters in iterations
    expected = []
    for it in range(30):  # MMCV's by-iteration before_train_iter: warm-up below warmup_iters, else get_lr
        if it < 10:
            expected.append(LR * ((it + 1) / 10) ** 2)
        elif it + 1 >= 30 - 10:
            expected.append(LR * 0.05)
        else:
            ratio = (it + 1 - 10) / (30 - 10 - 10)
            expected.append(LR * 0.05 + 0.5 * (LR - LR * 0.05) * (math.cos(math.pi * ratio) + 1))
    assert seen.lrs == pytest.approx(expected, rel=1e-12)
    assert seen.lrs[3] == pytest.approx(LR * 0.16)


def test_by_epoch_warmup_override_reads_regular_lr_and_get_regular_lr_is_consulted(tmp_path):
    class HalfWarmup(StepLrUpdaterHook):
        def get_warmup_lr(self, cur_iters):
            return [lr * 0.5 for lr in self.regular_lr]  # MMCV: regular_lr holds this epoch's lr

    class Doubled(FixedLrUpdaterHook):
        def get_regular_lr(self, trainer):
            return [2 * lr for lr in self.base_lr]

    seen = LrSeen()
    trainer = make(tmp_path / 'a', lr_config=HalfWarmup(step=[1], warmup='constant', warmup_iters=1,
                                                      warmup_by_epoch=True))
    trainer.register_hook(seen)
    train_and_close(trainer)
    # MMCV by epoch: regular lr at each epoch's start; warm-up while iter < warmup_iters (10)
    assert seen.lrs == pytest.approx([LR * 0.5] * 10 + [LR * 0.1] * 10, rel=1e-12)

    seen = LrSeen()
    trainer = make(tmp_path / 'b', lr_config=Doubled(by_epoch=False))
    trainer.register_hook(seen)
    train_and_close(trainer)
    assert seen.lrs == pytest.approx([2 * LR] * 20, rel=1e-12)


def test_a_momentum_subclass_overriding_get_warmup_momentum_is_consulted(tmp_path):
    class Warm(MomentumUpdaterHook):
        def get_momentum(self, trainer, base_momentum):
            return base_momentum

        def get_warmup_momentum(self, cur_iters):
            return [m / 2 for m in self.regular_mom]

    seen = LrSeen()
    trainer = make(tmp_path, momentum_config=Warm(by_epoch=False, warmup='linear', warmup_iters=4))
    trainer.register_hook(seen)
    train_and_close(trainer)
    assert seen.momenta == pytest.approx([0.45] * 4 + [0.9] * 16, rel=1e-12)


def test_a_subclass_accepts_its_bases_arguments_through_any_depth_of_kwargs():
    @HOOKS.register_module(force=True)
    class MyStep(StepLrUpdaterHook):
        def __init__(self, extra=1, **kwargs):
            self.extra = extra
            super().__init__(**kwargs)

    hook = HOOKS.build(dict(type='MyStep', step=[2], by_epoch=False, warmup='linear', warmup_iters=3, extra=2))
    assert (hook.by_epoch, hook.warmup_iters, hook.step, hook.extra) == (False, 3, [2], 2)
    with pytest.raises(ConfigError, match=r"MyStep got an unexpected argument 'by_epochs'.*'by_epoch'"):
        HOOKS.build(dict(type='MyStep', step=[2], by_epochs=False))

    class Fixed(StepLrUpdaterHook):  # its own closed signature, not the base's published one
        def __init__(self, step):
            super().__init__(step=step)

    HOOKS.register_module(module=Fixed, force=True)
    with pytest.raises(ConfigError, match=r"Fixed got an unexpected argument 'by_epoch'"):
        HOOKS.build(dict(type='Fixed', step=[2], by_epoch=False))


# -- 4. intervals that change during a run -------------------------------------------------------------
VAL = dict(max_epochs=2)


def validations_of(tmp_path, hooks=(), evaluation=None):
    from conftest import regression_data
    from torch.utils.data import DataLoader
    done = []

    class Seen(Hook):
        def after_val_epoch(self, trainer):
            done.append(trainer.iter + 1)  # the training iterations completed

    trainer = make(tmp_path, val_dataloader=DataLoader(regression_data(n=8, seed=1), batch_size=4),
                   val_evaluator=lambda loss, batch: {'mse': loss}, evaluation=evaluation)
    trainer.register_hook(Seen())
    for hook in hooks:
        trainer.register_hook(hook)
    train_and_close(trainer)
    return done


class DynamicEval(EvaluationHook):
    """mmdet's EvalHook ``dynamic_intervals``: the interval is decided before every iteration."""

    def __init__(self, dynamic_intervals, **kwargs):
        super().__init__(**kwargs)
        self.milestones = [0] + [m for m, _ in dynamic_intervals]
        self.intervals = [self.interval] + [i for _, i in dynamic_intervals]

    def before_train_iter(self, trainer):
        self.interval = self.intervals[bisect.bisect(self.milestones, trainer.iter + 1) - 1]


def test_mmdet_dynamic_intervals_evaluate_at_the_new_interval(tmp_path):
    hook = DynamicEval([(15, 2)], interval=10, by_epoch=False)
    # MMCV: evaluate after iteration counts divisible by the interval of that iteration, and the last
    assert validations_of(tmp_path, evaluation=hook) == [10, 16, 18, 20]


def test_replan_after_another_hook_changes_an_interval(tmp_path):
    evaluation = EvaluationHook(interval=10, by_epoch=False)

    class Changer(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter == 14:
                evaluation.interval = 2
                trainer.replan(evaluation)

    assert validations_of(tmp_path, [Changer()], evaluation) == [10, 16, 18, 20]


def test_a_call_at_one_iteration_stage_asks_the_other_again(tmp_path):
    seen = []

    class Own(Hook):
        interval = 10

        def next_call(self, trainer, stage, start):
            if stage == 'before_train_iter':
                return 14 if start <= 14 else NEVER
            return self.next_every_n_iters(start, self.interval)

        def before_train_iter(self, trainer):
            if trainer.iter == 14:
                self.interval = 2

        def after_train_iter(self, trainer):
            if self.every_n_iters(trainer, self.interval):
                seen.append(trainer.iter + 1)

    trainer = make(tmp_path)
    trainer.register_hook(Own())
    train_and_close(trainer)
    assert seen == [10, 16, 18, 20]


# -- 5. a wake at an epoch's last iteration ------------------------------------------------------------
def test_a_wake_at_an_epochs_last_iteration_is_not_lost(tmp_path):
    log = []
    sleeper = Sleeper(log)
    trainer = make(tmp_path)
    trainer.register_hook(sleeper, priority='HIGHEST')
    # the first epoch's last iteration, after the sleeper's turn
    trainer.register_hook(Waker(sleeper, (9,)), priority='NORMAL')
    train_and_close(trainer)
    assert log == [10]


# -- 6. train() again continues --------------------------------------------------------------------------
def final_weights(trainer):
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_train_again_after_a_stop_does_not_reload_load_from(tmp_path):
    source = make(tmp_path / 'source', epochs=1)
    train_and_close(source)
    torch.save({'state_dict': source.model.state_dict(), 'meta': {}}, tmp_path / 'weights.pth')
    plain = make(tmp_path / 'plain', load_from=str(tmp_path / 'weights.pth'))
    train_and_close(plain)
    stopped = make(tmp_path / 'stopped', load_from=str(tmp_path / 'weights.pth'))
    stopped.register_hook(StopAt(4))
    stopped.train()
    assert stopped.iter == 5
    stopped.train()
    stopped.close()
    assert stopped.iter == 20
    assert torch.equal(final_weights(stopped), final_weights(plain))


@pytest.mark.parametrize('how', ['resume_from', 'auto_resume'])
def test_train_again_after_a_stop_does_not_rewind_to_the_resume_checkpoint(tmp_path, how):
    first = make(tmp_path / 'run', checkpoint_config=dict(interval=5, by_epoch=False, max_keep_ckpts=1))
    first.register_hook(StopAt(7))
    train_and_close(first)  # leaves iter_5.pth
    plain = make(tmp_path / 'run_copy', resume_from=str(tmp_path / 'run' / 'iter_5.pth'))
    train_and_close(plain)
    kwargs = dict(resume_from=str(tmp_path / 'run' / 'iter_5.pth')) if how == 'resume_from' else dict(auto_resume=True)
    ran = []

    class Count(Hook):
        def after_train_iter(self, trainer):
            ran.append(trainer.iter)

    again = make(tmp_path / 'run', **kwargs)
    again.register_hook(StopAt(11))
    again.register_hook(Count())
    again.train()
    again.train()
    again.close()
    assert ran == list(range(5, 20))
    assert torch.equal(final_weights(again), final_weights(plain))


def test_resume_called_between_runs_applies_to_the_next_train(tmp_path):
    trainer = make(tmp_path, checkpoint_config=dict(interval=5, by_epoch=False))
    train_and_close(trainer)
    trainer.resume(str(tmp_path / 'iter_15.pth'))
    ran = []

    class Count(Hook):
        def after_train_iter(self, trainer):
            ran.append(trainer.iter)
    trainer.register_hook(Count())
    train_and_close(trainer)
    assert ran == list(range(15, 20))


# -- 7. set-up is not keyed by a reusable id ---------------------------------------------------------------
def test_a_new_hook_that_reuses_a_freed_hooks_id_is_set_up(tmp_path, monkeypatch):
    """CPython gives a new object the id of a freed one; here the new hook is made to report
    the first one's id, to make that certain."""
    trainer = make(tmp_path)
    trainer.register_hook(StopAt(4))
    first = trainer.register_hook(EMAHook())
    trainer.train()
    second = EMAHook()
    real_id = id
    monkeypatch.setattr(hookloop.engine.trainer, 'id', lambda obj: real_id(first) if obj is second else real_id(obj),
                        raising=False)
    trainer.register_hook(second)
    train_and_close(trainer)
    assert second.averages is not None
