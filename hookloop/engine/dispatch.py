"""Hook dispatch: the stage -> bound methods table the trainer calls, each hook's ``setup``,
per-hook timing (``profile_hooks``), and the note a user error gets naming the hook and
stage it came from.

The table lives on the trainer (``trainer._dispatch``, and ``trainer._iteration_stages`` for
the scheduled training-iteration stages): the loop reads them directly, with no call in
between. These functions build and use them; the trainer's public methods
(``resolve_hooks``, ``call_hook``, ``wake``, ``replan``, ...) are the API.
"""
import time
import weakref

import torch

from ..errors import HookloopError
from ..hooks.base import SETUP_STAGE
from .iteration_calls import iteration_stages


def build_dispatch(trainer):
    """Add default hooks for the roles left empty and build the dispatch tables, once per
    change of the hooks (``trainer._dispatch`` is reset to None by a registration)."""
    if trainer._dispatch is not None:
        return
    # Several optimizers with a train_step model: the model steps them (MMCV's GAN contract).
    model_steps = trainer._model_train_step and not isinstance(trainer.optimizer, torch.optim.Optimizer)
    hook_list = trainer._hook_list
    hook_list.add_defaults(trainer.optimizer is not None and not model_steps, trainer.val_dataloader is not None)
    table = hook_list.stage_table()
    trainer._dispatch = {stage: [timed(trainer, h, stage) if trainer.profile_hooks else getattr(h, stage)
                                 for h in hooks]
                         for stage, hooks in table.items()}
    trainer._iteration_stages = iteration_stages(table, trainer._dispatch, trainer._call_each)


def setup_hooks(trainer):
    """``setup(trainer)`` once per hook and trainer, in the order of the setup stage
    (``trainer._set_up``: id(hook) -> a weak reference to the hook whose setup ran)."""
    set_up = trainer._set_up
    for hook, method in zip(trainer._hook_list.stage_table()[SETUP_STAGE], trainer._dispatch[SETUP_STAGE]):
        ref = set_up.get(id(hook))
        if ref is None or ref() is not hook:
            try:
                set_up[id(hook)] = weakref.ref(hook)  # a new hook reusing a dead one's id: ref() is None
            except TypeError:  # no weak references to it: hold the hook itself
                set_up[id(hook)] = lambda hook=hook: hook
            method(trainer)


def timed(trainer, hook, stage):
    """``hook``'s ``stage`` method, adding its run time to ``trainer.hook_timings``."""
    method, timing = getattr(hook, stage), trainer.hook_timings.setdefault((hook.name, stage), [0.0, 0])
    clock = time.perf_counter

    def timed_call(*args):
        start = clock()
        try:
            return method(*args)
        finally:
            timing[0] += clock() - start
            timing[1] += 1
    timed_call.__self__ = hook
    return timed_call


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


__all__ = ['build_dispatch', 'hook_name', 'say_where', 'setup_hooks', 'timed']
