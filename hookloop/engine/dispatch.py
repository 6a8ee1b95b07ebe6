"""Hook dispatch, the Trainer's half that registers hooks and calls them: the hook list, the
stage -> bound methods table built once per change of the hooks, each hook's ``setup``,
per-hook timing (``profile_hooks``), the iteration stages' schedules (``wake``, ``replan``)
and the note a user error gets naming the hook and stage it came from.

:class:`HookDispatch` is a base of :class:`~hookloop.Trainer`; its state is the trainer's
(``_hook_list``, ``_dispatch``, ``_iteration_stages``, ``_set_up``, made by
:meth:`HookDispatch._init_dispatch`), because the training loop reads the tables directly,
with no call in between. Its public methods are the trainer's API.
"""
import time
import weakref

import torch

from ..errors import HookloopError
from ..hooks.base import SETUP_STAGE
from ..logging.flusher import flush_logs
from .hook_list import HookList
from .iteration_calls import iteration_stages

# Stages before which the trackers' waiting records are handed over (hookloop.logging.flusher):
# a hook there may read them, and a checkpoint is built with the records of the iterations before
# its own handed over (its own iteration's come after: loggers run last).
FLUSH_BEFORE = frozenset(('after_train_epoch', 'after_val_epoch', 'before_save_checkpoint'))


class HookDispatch:
    """``register_hook``, ``register_training_hooks``, ``resolve_hooks``, ``hook_order_table``,
    ``call_hook``, ``wake``, ``replan`` and ``hooks`` of the trainer."""

    def _init_dispatch(self, profile_hooks):
        self.profile_hooks = profile_hooks
        self.hook_timings = {}  # (hook name, stage) -> [seconds, calls], with profile_hooks
        self._hook_list = HookList()
        self._dispatch = self._iteration_stages = None
        self._set_up = {}  # id(hook) -> a weak reference to the hook whose setup() ran
        self._in_epoch = False  # the iteration stages are planned: other stages' calls ask again

    @property
    def hooks(self):
        """The registered hooks, by priority (ties in registration order)."""
        return self._hook_list.hooks

    def register_hook(self, hook, priority=None):
        """Register a Hook instance or a config dict (which may carry a ``priority`` key).

        ``priority`` (a name such as ``'NORMAL'`` or an int 0..100) overrides the dict's
        and the class's ``PRIORITY``. Lower values run first; ties run in registration order;
        dependencies hook classes declare (``RUNS_AFTER``/``RUNS_BEFORE``) win over priorities.
        A hook cannot be registered while ``train()`` runs (ConfigError): the hooks of a run
        are fixed when it starts.
        """
        hook = self._hook_list.register(hook, priority)
        self._dispatch = None
        return hook

    def register_training_hooks(self, lr_config=None, optimizer_config=None, checkpoint_config=None,
                                log_config=None, momentum_config=None, timer_config=None,
                                custom_hooks_config=None):
        """Register the standard hooks from their configs, with MMCV's priorities:
        lr VERY_HIGH, momentum HIGH, optimizer ABOVE_NORMAL, checkpoint NORMAL, timer LOW,
        loggers VERY_LOW; custom hooks NORMAL unless their dict says ``priority=...``."""
        self._hook_list.register_training_hooks(lr_config, optimizer_config, checkpoint_config, log_config,
                                                momentum_config, timer_config, custom_hooks_config)
        self._dispatch = None

    def resolve_hooks(self):
        """Add default hooks for empty roles, build the stage -> methods dispatch table and
        run ``setup`` of the hooks that have not been set up on this trainer yet."""
        if self._dispatch is None:
            # Several optimizers with a train_step model: the model steps them (MMCV's GAN contract).
            model_steps = self._model_train_step and not isinstance(self.optimizer, torch.optim.Optimizer)
            self._hook_list.add_defaults(self.optimizer is not None and not model_steps,
                                         self.val_dataloader is not None)
            table = self._hook_list.stage_table()
            self._dispatch = {stage: [self._timed(h, stage) if self.profile_hooks else getattr(h, stage)
                                      for h in hooks]
                              for stage, hooks in table.items()}
            self._iteration_stages = iteration_stages(table, self._dispatch)
        return self._hook_list.stage_table()

    def _setup_hooks(self):
        """``setup(trainer)`` once per hook and trainer, in the order of the setup stage."""
        for hook, method in zip(self._hook_list.stage_table()[SETUP_STAGE], self._dispatch[SETUP_STAGE]):
            if not self._was_set_up(hook):
                try:
                    self._set_up[id(hook)] = weakref.ref(hook)  # a new hook reusing a dead one's id: ref() is None
                except TypeError:  # no weak references to it: hold the hook itself
                    self._set_up[id(hook)] = lambda hook=hook: hook
                method(self)

    def _was_set_up(self, hook):
        ref = self._set_up.get(id(hook))
        return ref is not None and ref() is hook

    def _timed(self, hook, stage):
        """``hook``'s ``stage`` method, adding its run time to ``hook_timings``."""
        method, timing = getattr(hook, stage), self.hook_timings.setdefault((hook.name, stage), [0.0, 0])
        clock = time.perf_counter

        def timed(*args):
            start = clock()
            try:
                return method(*args)
            finally:
                timing[0] += clock() - start
                timing[1] += 1
        timed.__self__ = hook
        return timed

    def hook_order_table(self):
        """The per-stage run order with priorities and declared dependencies."""
        self.resolve_hooks()
        return self._hook_list.format_table()

    def call_hook(self, stage, *args):
        """Call ``stage`` on every hook that implements it, in order."""
        if stage in FLUSH_BEFORE:
            flush_logs()
        self._call_each(self._dispatch[stage], stage, *args)
        if self._in_epoch:  # during an epoch (a validation, a save): what they did may move a schedule
            for hook in self._hook_list.stage_table()[stage]:
                self.replan(hook)

    def _call_each(self, methods, stage, *args):
        """Call each of ``methods`` (one stage's dispatch list); a user error gets a note that
        names the hook and the stage."""
        for method in methods:
            try:
                method(self, *args)
            except Exception as exc:
                self._note_hook_error(exc, method, stage)
                raise

    def _note_hook_error(self, exc, method, stage):
        say_where(exc, f'{hook_name(method)}.{stage} at epoch {self.epoch + 1}, iteration {self.iter}')

    def wake(self, hook):
        """Call ``hook`` at its training-iteration stages in the next iteration, whatever its
        :meth:`~hookloop.Hook.next_call` said (for work an event makes due, such as a new meter
        summary); a wake between epochs: in the next epoch's first. Always the next, never the
        current one, so a woken hook is called at the same iterations however the others are
        scheduled. No effect outside ``train()`` or on hooks called every iteration."""
        if self._iteration_stages is not None:
            for stage in self._iteration_stages.values():
                stage.wake(hook, self.position.iter + 1)

    def replan(self, hook=None):
        """Ask ``hook`` (None: every hook) again when its training-iteration stages are next
        due (:meth:`~hookloop.Hook.next_call`): a hook calls this when something its schedule
        depends on changed outside its own calls (another hook set its interval). No effect
        outside an epoch: every epoch's start asks anyway."""
        if self._in_epoch:
            for stage in self._iteration_stages.values():
                stage.replan(self, hook)


def say_where(exc, where):
    """Note on a user-code error where hookloop was when it happened (the innermost place
    wins). ``hookloop train`` prints it as the first line, above the traceback."""
    if isinstance(exc, HookloopError):  # already one clear line
        return
    if not any(note.startswith('hookloop: raised while ') for note in getattr(exc, '__notes__', ())):
        exc.add_note(f'hookloop: raised while {where}' if where.startswith('loading') else
                     f'hookloop: raised while running {where}')


def hook_name(method):
    hook = getattr(method, '__self__', None)
    return getattr(hook, 'name', type(hook).__name__) if hook is not None else getattr(method, '__name__', '?')


__all__ = ['HookDispatch', 'hook_name', 'say_where']
