"""The stages MMCV's ``IterBasedRunner`` calls, for the hooks written for MMCV.

``IterBasedRunner.run`` calls ``before_run``, then ``before_epoch`` **once**, then only the
iteration stages (``before/after_train_iter``, ``before/after_val_iter`` in a ``('val', k)``
phase), then ``after_epoch`` **once** and ``after_run``; never ``before/after_train_epoch``
nor the val-epoch stages. hookloop's loop has an epoch per pass over the loader, so in an
iteration-based MMCV run :func:`apply_iter_runner_stages` rewrites the trainer's dispatch
table: a hook whose epoch-stage code is MMCV code (a repository's or a user's hook, or one of
``hookloop.compat.mmcv``'s own MMCV hooks) is not called at the passes' epoch stages; its
``before_epoch`` runs once after every hook's ``before_run``, its ``after_epoch`` once before
the first ``after_run`` when the run ended without an error. A hook set to count epochs
(``by_epoch=True``) acts at no pass's end (no ``after_train_epoch``), as in MMCV. Otherwise
hookloop's own hooks (timer, loggers, checkpoint, evaluation...) keep their epoch stages: they
are written for the passes.
"""
from ...hooks.base import GENERIC_STAGE, Hook

EPOCH_STAGES = ('before_train_epoch', 'after_train_epoch', 'before_val_epoch', 'after_val_epoch')


def runs_mmcv_code(hook, stage):
    """True when what ``hook`` does at ``stage`` (or at the generic stage Hook's default
    delegates ``stage`` to) is code written for MMCV's runner, not one of hookloop's own hooks."""
    method = getattr(type(hook), stage, None)
    if method is getattr(Hook, stage) and stage in GENERIC_STAGE:
        method = getattr(type(hook), GENERIC_STAGE[stage])
    module = getattr(method, '__module__', None) or ''
    return not module.startswith('hookloop.') or module.startswith('hookloop.compat.mmcv')


def counts_epochs(hook):
    """A hook set to act per epoch (``by_epoch=True``): in an IterBasedRunner run MMCV never
    calls its ``after_train_epoch`` (a CheckpointHook registered with ``by_epoch=True`` saves
    nothing, an EvalHook with it never evaluates)."""
    return getattr(hook, 'by_epoch', None) is True


class _OncePerRun:
    """The once-per-run generic epoch stages, as entries of the dispatch table."""

    name = 'IterBasedRunner(before_epoch/after_epoch)'

    def __init__(self, hooks):
        self.before = [hook for hook in hooks if runs_mmcv_code(hook, 'before_epoch')]
        self.after = [hook for hook in hooks if runs_mmcv_code(hook, 'after_epoch')]

    def before_epoch(self, trainer):
        for hook in self.before:
            hook.before_epoch(trainer)

    def after_epoch(self, trainer):
        if not trainer.outcome.failed:  # MMCV reaches after_epoch only when the loop finished
            for hook in self.after:
                hook.after_epoch(trainer)


def apply_iter_runner_stages(dispatch, hooks):
    """Rewrite ``dispatch`` (stage -> bound methods, the trainer's table) in place for an
    iteration-based MMCV run (see the module docstring). ``hooks``: the hooks in run order."""
    for stage in EPOCH_STAGES:
        dispatch[stage] = [method for method in dispatch[stage] if not runs_mmcv_code(method.__self__, stage)
                           and not (stage == 'after_train_epoch' and counts_epochs(method.__self__))]
    once = _OncePerRun(hooks)
    dispatch['before_run'] = list(dispatch['before_run']) + [once.before_epoch]
    dispatch['after_run'] = [once.after_epoch] + list(dispatch['after_run'])


__all__ = ['apply_iter_runner_stages', 'counts_epochs', 'runs_mmcv_code']
