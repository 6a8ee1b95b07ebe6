"""Where a run is: the counters every hook reads, and the resume point a checkpoint stores.

``trainer.position`` is the one place the counters live (``trainer.epoch``, ``trainer.iter``
and ``trainer.inner_iter`` read it). As in MMCV, ``iter``/``inner_iter`` are the 0-based index
of the current iteration during ``before_train_iter``/``after_train_iter`` and grow after it;
``epoch`` is the index of the current epoch.

A checkpoint can be written at any stage, so the position also knows whether the current
iteration or epoch is *complete* (its ``after_*`` stage is running): :meth:`Position.state_dict`
is then the *next* iteration to run, the one a resume starts from. The trainer moves the
position: its training loop sets ``phase`` to ``'iteration_done'`` before ``after_train_iter``
and then counts the iteration (``iter``, ``inner_iter`` + 1, ``phase`` back to ``'between'``),
written out there to save two calls per step; :meth:`end_epoch`/:meth:`next_epoch` do the same
for an epoch. Hooks only read it.
"""

# What the position is doing, for the resume point and for hooks that need to know.
BETWEEN = 'between'            # before an iteration, or outside training
ITERATION_DONE = 'iteration_done'  # after_train_iter is running: the iteration is complete
EPOCH_DONE = 'epoch_done'      # after_train_epoch is running: the epoch is complete


class Position:
    """Counters of a run: ``epoch``, ``iter`` (global), ``inner_iter`` (in the epoch),
    ``val_iter`` (in the current validation), ``validations`` (validation loops completed
    by this trainer) and ``phase`` (one of ``'between'``, ``'iteration_done'``,
    ``'epoch_done'``)."""

    __slots__ = ('epoch', 'iter', 'inner_iter', 'val_iter', 'validations', 'phase')

    def __init__(self):
        self.epoch = self.iter = self.inner_iter = self.val_iter = self.validations = 0
        self.phase = BETWEEN

    # -- moved by the trainer (iterations: in its loop) -------------------------------------
    def end_epoch(self):
        self.phase = EPOCH_DONE

    def next_epoch(self):
        self.epoch += 1
        self.inner_iter = 0
        self.phase = BETWEEN

    # -- read by hooks ---------------------------------------------------------------------
    @property
    def in_train_iteration(self):
        """True while ``after_train_iter`` runs (e.g. a validation started from there)."""
        return self.phase == ITERATION_DONE

    def resume_point(self):
        """``(epoch, iter, inner_iter)`` of the next iteration to run."""
        if self.phase == ITERATION_DONE:
            return self.epoch, self.iter + 1, self.inner_iter + 1
        if self.phase == EPOCH_DONE:
            return self.epoch + 1, self.iter, 0
        return self.epoch, self.iter, self.inner_iter

    # -- what a checkpoint stores ----------------------------------------------------------
    def state_dict(self):
        epoch, it, inner_iter = self.resume_point()
        return {'epoch': epoch, 'iter': it, 'inner_iter': inner_iter}

    def load_state_dict(self, state):
        self.epoch, self.iter, self.inner_iter = state['epoch'], state['iter'], state['inner_iter']
        self.phase = BETWEEN


__all__ = ['Position']
