"""Who is called at a training-iteration stage: the hooks that work at every iteration, plus
those whose :meth:`~hookloop.Hook.next_call` named this iteration.

Most hooks act at a few iterations (a logger every 50, a checkpoint by epoch, a guard at log
events); calling them at every other iteration only to return is most of a loop's framework
cost. So each stage keeps the iteration each scheduled hook is due at, and an iteration
before the earliest of them calls only the every-iteration hooks: one comparison for all
the others. When some hook is due, the stage walks all its hooks in the usual order, so a
scheduled hook still runs exactly where its priority and declared dependencies put it.

A schedule is only an optimisation: every stage method must be right when called at every
iteration (the tests run every hook at every iteration and compare). So a hook is skipped
only where its ``next_call`` can know everything the call would run: a class that overrides
a method the ``next_call`` it inherits was not written for (see :func:`hook_blind_spots`)
is called at every iteration, and answers are asked again whenever they may have changed
(after each call of the hook, at an epoch's start, after ``trainer.replan``, a resume or a
validation).
"""
import weakref
from numbers import Integral

from ..errors import ConfigError
from ..hooks.base import ITERATION_STAGES, NEVER
from ..hooks.blind_spots import hook_blind_spots

class IterationStage:
    """The hooks of one iteration stage, in run order, with when each is due.

    ``methods`` are the bound methods the trainer dispatches (wrapped when hooks are
    profiled), ``hooks`` their hooks; they are called through the trainer's ``_call_each``
    (it adds the hook and stage to a user error). ``partner`` is the other iteration stage:
    a hook's call at one stage asks its other stage again (what it did may move that one).
    """

    def __init__(self, stage, hooks, methods):
        self.stage, self.hooks, self.methods = stage, list(hooks), list(methods)
        self._scheduled = [not hook_blind_spots(hook) for hook in self.hooks]  # may they skip iterations
        self.due = [None] * len(self.hooks)  # per hook: None = every iteration, else an iteration or NEVER
        self.every = list(self.methods)       # the methods called at every iteration
        self.next_due = NEVER                 # the earliest due of the scheduled hooks
        self.running = iter(())               # the trainer's loop over ``every`` (its fast path), once started
        self._walking = False                 # walk() runs: it sees every change of ``due`` itself
        self._woken = set()                   # hooks woken and not called since
        self.partner, self._partner_index = None, [None] * len(self.hooks)

    def pair(self, other):
        """Make ``self`` and ``other`` (the two iteration stages) partners (weakly: the trainer holds
        both, and no cycle may keep a dropped trainer's hooks alive)."""
        self.partner, other.partner = weakref.proxy(other), weakref.proxy(self)
        for a, b in ((self, other), (other, self)):
            a._partner_index = [next((j for j, h in enumerate(b.hooks) if h is hook), None) for hook in a.hooks]

    def plan(self, trainer):
        """Ask every hook when it is next due (at the start of an epoch). A wake not yet acted
        on (one made at an epoch's last iteration) is kept: the hook is due at once."""
        self.running = iter(())  # a loop an error left unfinished is not this epoch's
        self.replan(trainer, None, trainer.position.iter)

    def replan(self, trainer, hook=None, start=None):
        """Ask ``hook`` (None: every hook) again when it is next due, from ``start`` (default:
        the current iteration; asking too early at worst calls the hook once more than needed).
        Made while this stage runs (another hook re-plans it), a hook due now that comes after
        the one running is called in this iteration."""
        start = trainer.position.iter if start is None else start
        for index, other in enumerate(self.hooks):
            if hook is None or other is hook:
                self._reask(trainer, index, start)
        self._join_running(trainer)
        self._refresh()

    def _reask(self, trainer, index, start):
        due = self._ask(trainer, index, start)
        if due is not None and index in self._woken:
            due = min(due, start)
        self.due[index] = due

    # The trainer's loop calls ``every`` itself while ``position.iter < next_due`` (one
    # comparison per iteration), through the iterator it keeps in ``running``, and :meth:`walk`
    # otherwise.
    def walk(self, trainer, first=0):
        """Call every hook due at the current iteration, in run order (from hook ``first`` on),
        and ask each scheduled one that ran when it is next due, at both iteration stages."""
        iteration = trainer.position.iter
        partner, after = self.partner, self.stage == 'after_train_iter'
        self._walking = True
        try:
            for index in range(first, len(self.methods)):
                method, due = self.methods[index], self.due[index]
                if due is None:
                    trainer._call_each((method,), self.stage)
                elif due <= iteration:
                    self.due[index] = NEVER  # a wake() from inside the call lowers it again
                    self._woken.discard(index)
                    trainer._call_each((method,), self.stage)
                    self.due[index] = min(self._ask(trainer, index, iteration + 1), self.due[index])
                    other = self._partner_index[index]
                    if other is not None and partner.due[other] is not None:
                        partner._reask(trainer, other, iteration + after)
                        partner._refresh()
        finally:
            self._walking = False
        self._refresh()

    def _join_running(self, trainer):
        """A re-plan made from inside the trainer's loop over ``every`` (a hook called at every
        iteration re-plans another): when it made a hook that comes after the running one due
        now, the rest of the stage becomes a :meth:`walk` from the next hook on, put next into
        the list the loop runs through (its iterator tells where it is: list iterators give
        their list and position to ``__reduce__``, the pickle protocol)."""
        if self._walking:
            return  # walk() reads ``due`` as it goes
        state = self.running.__reduce__()
        if len(state) < 3 or not state[2]:
            return  # the loop is over (or not started): the stage is not running
        (running,), position = state[1], state[2]
        current = next((i for i, method in enumerate(self.methods) if method is running[position - 1]), None)
        iteration = trainer.position.iter
        if current is None or not any(due is not None and due <= iteration for due in self.due[current + 1:]):
            return

        def rest_of_stage(trainer):
            del running[position + 1:]  # the hooks the loop has not reached yet: the walk calls them
            self.walk(trainer, current + 1)
        running.insert(position, rest_of_stage)

    def wake(self, hook, iteration):
        """Have ``hook`` called at ``iteration`` (or the first iteration after it that reaches
        this stage)."""
        for index, other in enumerate(self.hooks):
            if other is hook and self.due[index] is not None:
                self._woken.add(index)
                if self.due[index] > iteration:
                    self.due[index] = iteration
                    self.next_due = min(self.next_due, iteration)

    def _ask(self, trainer, index, start):
        """When hook ``index`` is next due, checked."""
        if not self._scheduled[index]:
            return None
        hook = self.hooks[index]
        due = hook.next_call(trainer, self.stage, start)
        if due is None or due == NEVER:
            return due
        if type(due) is int and due >= start:  # the usual answer, without the ABC check below
            return due
        if isinstance(due, bool) or not isinstance(due, Integral) or due < start:
            raise ConfigError(f'{type(hook).__name__}.next_call(trainer, {self.stage!r}, {start}) returned {due!r}: '
                              f'it must be None (every iteration), NEVER or an iteration >= {start}')
        return int(due)

    def _refresh(self):
        self.every = [method for method, due in zip(self.methods, self.due) if due is None]
        self.next_due = min([due for due in self.due if due is not None], default=NEVER)


def iteration_stages(table, dispatch):
    """``{stage: IterationStage}`` for the two training-iteration stages, paired."""
    stages = {stage: IterationStage(stage, table[stage], dispatch[stage]) for stage in ITERATION_STAGES}
    stages['before_train_iter'].pair(stages['after_train_iter'])
    return stages


__all__ = ['IterationStage', 'iteration_stages']
