"""Who is called at a training-iteration stage: the hooks that work at every iteration, plus
those whose :meth:`~hookloop.Hook.next_call` named this iteration.

Most hooks act at a few iterations (a logger every 50, a checkpoint by epoch, a guard at log
events); calling them at every other iteration only to return is most of a loop's framework
cost. So each stage keeps the iteration each scheduled hook is due at, and an iteration
before the earliest of them calls only the every-iteration hooks: one comparison for all
the others. When some hook is due, the stage walks all its hooks in the usual order, so a
scheduled hook still runs exactly where its priority and declared dependencies put it.
"""
from numbers import Integral

from .errors import ConfigError
from .hooks.base import NEVER


class IterationStage:
    """The hooks of one iteration stage, in run order, with when each is due.

    ``methods`` are the bound methods the trainer dispatches (wrapped when hooks are
    profiled), ``hooks`` their hooks. ``call_each(methods, stage)`` is the trainer's caller
    (it adds the hook and stage to a user error).
    """

    def __init__(self, stage, hooks, methods, call_each):
        self.stage, self.hooks, self.methods, self._call_each = stage, list(hooks), list(methods), call_each
        self._scheduled = [_schedule_covers(type(hook), stage) for hook in self.hooks]  # may they skip iterations
        self.due = [None] * len(self.hooks)  # per hook: None = every iteration, else an iteration or NEVER
        self.every = self.methods             # the methods called at every iteration
        self.next_due = NEVER                 # the earliest due of the scheduled hooks
        self._woken = set()                   # hooks woken and not called since

    def plan(self, trainer):
        """Ask every hook when it is next due (at the start of an epoch). A wake not yet acted
        on (one made at an epoch's last iteration) is kept: the hook is due at once."""
        start = trainer.position.iter
        due = [self._ask(trainer, index, start) for index in range(len(self.hooks))]
        for index in self._woken:
            if due[index] is not None:
                due[index] = min(due[index], start)
        self.due = due
        self._refresh()

    # The trainer's loop calls ``every`` itself while ``position.iter < next_due`` (one
    # comparison per iteration), and :meth:`walk` otherwise.
    def walk(self, trainer):
        """Call every hook due at the current iteration, in run order, and ask each scheduled
        one that ran when it is next due."""
        iteration = trainer.position.iter
        for index, method in enumerate(self.methods):
            due = self.due[index]
            if due is None:
                self._call_each((method,), self.stage)
            elif due <= iteration:
                self.due[index] = NEVER  # a wake() from inside the call lowers it again
                self._woken.discard(index)
                self._call_each((method,), self.stage)
                self.due[index] = min(self._ask(trainer, index, iteration + 1), self.due[index])
        self._refresh()

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
        if isinstance(due, bool) or not isinstance(due, Integral) or due < start:
            raise ConfigError(f'{type(hook).__name__}.next_call(trainer, {self.stage!r}, {start}) returned {due!r}: '
                              f'it must be None (every iteration), NEVER or an iteration >= {start}')
        return int(due)

    def _refresh(self):
        self.every = [method for method, due in zip(self.methods, self.due) if due is None]
        self.next_due = min([due for due in self.due if due is not None], default=NEVER)


def _defining_class(cls, name):
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _schedule_covers(cls, stage):
    """False when a subclass overrides ``stage`` below the class whose ``next_call`` it
    inherits: that ``next_call`` knows nothing of the new method, which then runs at every
    iteration (a user's subclass of a built-in hook is never silently skipped)."""
    schedule, method = _defining_class(cls, 'next_call'), _defining_class(cls, stage)
    return method is None or schedule is None or not (issubclass(method, schedule) and method is not schedule)


__all__ = ['IterationStage']
