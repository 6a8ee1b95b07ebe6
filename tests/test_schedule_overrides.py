"""The scheduler's rule for overrides (issue 38 items 3 and 4): whatever kind of attribute a
user's class (or a hook instance) puts at a stage the inherited ``next_call`` was not written
for -- a ``partialmethod``, a ``singledispatchmethod``, a staticmethod, a callable object, a
method set on the instance -- the hook is called at every iteration; and a re-plan made by
another hook during an iteration takes effect in that iteration for the hooks not yet run."""
import functools

import pytest

from conftest import train_and_close
from hookloop import Hook
from hookloop.hooks import CheckpointHook, TextLoggerHook
from hookloop.hooks.blind_spots import hook_blind_spots
from log_utils import json_records
from test_iteration_schedule import make

ITERS = 10  # one epoch of 40 samples in batches of 4


def _record(seen, trainer, *_):
    seen.append(trainer.iter)


class Calls:
    """A callable object put at a stage: dispatch calls it with the trainer only."""

    def __init__(self, seen):
        self.seen = seen

    def __call__(self, trainer):
        self.seen.append(trainer.iter)


def subclass(kind, seen):
    """A CheckpointHook subclass (by epoch: its next_call says NEVER at every iteration) whose
    ``after_train_iter`` is an attribute of the given kind."""
    if kind == 'partialmethod':
        body = {'after_train_iter': functools.partialmethod(lambda self, trainer, seen: _record(seen, trainer),
                                                              seen=seen)}
    elif kind == 'singledispatchmethod':
        method = functools.singledispatchmethod(lambda self, trainer: _record(seen, trainer))
        body = {'after_train_iter': method}
    elif kind == 'staticmethod':
        body = {'after_train_iter': staticmethod(lambda trainer: _record(seen, trainer))}
    elif kind == 'callable object':
        body = {'after_train_iter': Calls(seen)}
    else:
        raise ValueError(kind)
    return type('UserCheckpoints', (CheckpointHook,), body)


@pytest.mark.parametrize('kind', ['partialmethod', 'singledispatchmethod', 'staticmethod', 'callable object'])
def test_an_override_of_any_kind_is_called_at_every_iteration(tmp_path, kind):
    """Before: a partialmethod or singledispatchmethod override was called at no iteration."""
    seen = []
    hook = subclass(kind, seen)(interval=1)
    assert hook_blind_spots(hook)
    train_and_close(make(tmp_path, epochs=1, checkpoint_config=hook))
    assert seen == list(range(ITERS))


def test_a_stage_method_set_on_an_instance_is_called_at_every_iteration(tmp_path):
    """Before: dispatched, but scheduled by CheckpointHook's next_call (by epoch: never)."""
    seen = []
    hook = CheckpointHook(interval=1)
    hook.after_train_iter = lambda trainer: seen.append(trainer.iter)
    assert hook_blind_spots(hook) == ('CheckpointHook instance.after_train_iter',)
    train_and_close(make(tmp_path, epochs=1, checkpoint_config=hook))
    assert seen == list(range(ITERS))


def test_an_instance_override_of_an_extension_method_keeps_the_logger_schedule_exact(tmp_path):
    """A logger's should_log set on the instance decides where records go: it runs every iteration."""
    logger = TextLoggerHook(interval=5, by_epoch=False)
    logger.should_log = lambda trainer: trainer.iter in (2, 7)
    train_and_close(make(tmp_path, epochs=1, log_config=dict(interval=5, hooks=[logger])))
    assert [r['iter'] for r in json_records(tmp_path, 'train')] == [3, 8]


def test_plain_data_class_attributes_and_a_class_with_its_own_next_call_keep_the_schedule():
    class Quiet(CheckpointHook):
        interval_label = 'every epoch'  # data, not something dispatch calls
        PRIORITY = 'NORMAL'

    class Own(Hook):
        def next_call(self, trainer, stage, start):
            return start

        def after_train_iter(self, trainer):
            pass

    own = Own()
    own.after_train_iter = lambda trainer: None  # its class's next_call answers for its instances
    assert hook_blind_spots(Quiet()) == () and hook_blind_spots(own) == ()


class SetsInterval(Hook):
    """At iteration ``at`` (in ``stage``), sets the logger's interval to ``interval`` and re-plans it."""

    def __init__(self, logger, at, interval, stage='after_train_iter'):
        self.logger, self.at, self.interval = logger, at, interval
        setattr(self, stage, self._act)

    def next_call(self, trainer, stage, start):
        return None  # every iteration: the re-plan is made from the trainer's fast path

    def _act(self, trainer):
        if trainer.iter == self.at:
            self.logger.interval = self.interval
            trainer.replan(self.logger)

    def after_train_iter(self, trainer):
        pass

    def before_train_iter(self, trainer):
        pass


@pytest.mark.filterwarnings('ignore::hookloop.hooks.order.HookOrderWarning')
@pytest.mark.parametrize('stage', ['before_train_iter', 'after_train_iter'])
@pytest.mark.parametrize('setter_priority', ['NORMAL', 'LOWEST'])  # loggers run last whatever the number
def test_a_replan_by_another_hook_takes_effect_in_the_current_iteration(tmp_path, stage, setter_priority):
    """Before: records at 10, 15, 20 (the re-plan made in after_train_iter of iteration 4 missed
    it). The scheduled run must equal the run that calls every hook at every iteration."""
    from test_iteration_schedule import unscheduled
    results = []
    for schedule in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not schedule:
                unscheduled(patch)
            logger = TextLoggerHook(interval=10, by_epoch=False)
            work_dir = tmp_path / str(schedule)
            trainer = make(work_dir, epochs=2, log_config=dict(interval=10, hooks=[logger]))
            trainer.register_hook(SetsInterval(logger, 4, 5, stage), priority=setter_priority)
            train_and_close(trainer)
            results.append([r['iter'] for r in json_records(work_dir, 'train')])
    assert results[0] == results[1] == [5, 10, 15, 20]


def test_two_replans_in_one_iteration_and_a_replan_during_a_walk_call_each_hook_once(tmp_path):
    """Re-plans from several every-iteration hooks in one stage, one of them while the stage walks
    (another hook is due): each re-planned hook runs once, in its place."""
    calls = []

    class Due(Hook):
        def __init__(self, label, every):
            self.label, self.every = label, every

        def next_call(self, trainer, stage, start):
            return self.next_every_n_iters(start, self.every)

        def after_train_iter(self, trainer):
            calls.append((self.label, trainer.iter))

    first, second, early = Due('first', 100), Due('second', 100), Due('early', 100)

    class Replans(Hook):
        def __init__(self, label, *targets):
            self.label, self.targets = label, targets

        def after_train_iter(self, trainer):
            calls.append((self.label, trainer.iter))
            if trainer.iter in (3, 6):
                for target in self.targets:
                    target.every = 1
                    trainer.replan(target)

    trainer = make(tmp_path, epochs=1)
    trainer.register_hook(early, priority=40)  # already passed when re-planned: from the next iteration
    trainer.register_hook(Replans('a', first), priority=41)
    trainer.register_hook(Due('ticker', 6), priority=42)  # due at 5: iteration 5's stage walks
    trainer.register_hook(Replans('b', second, early), priority=43)
    trainer.register_hook(first, priority=44)
    trainer.register_hook(second, priority=45)
    train_and_close(trainer)
    at = {it: [label for label, i in calls if i == it] for it in range(ITERS)}
    assert at[2] == ['a', 'b']
    assert at[3] == ['a', 'b', 'first', 'second']
    assert at[4] == ['early', 'a', 'b', 'first', 'second']
    assert at[5] == ['early', 'a', 'ticker', 'b', 'first', 'second']
    assert at[6] == ['early', 'a', 'b', 'first', 'second']
