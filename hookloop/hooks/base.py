"""The Hook base class: named stages, each a no-op, and the interval helpers.

A hook overrides the stages it needs. The trainer calls a hook only at the stages
its class overrides (see :func:`overrides`), so an unused stage costs nothing. At the two
training-iteration stages a hook may also say at which iterations it has work
(:meth:`Hook.next_call`), so a hook that logs every 50 iterations costs nothing at the
other 49. MMCV's generic stages (``before_epoch``, ``after_iter``, ...) are supported: a
hook that defines only ``after_iter`` is called after train *and* val iterations.
"""
import math

from ..priority import Priority

# The stages in the order a run meets them; checkpoint stages take the checkpoint dict.
# ``setup`` runs once per trainer and hook (see Hook.setup), the others at every train().
SETUP_STAGE = 'setup'
TRAIN_STAGES = ('before_run', 'before_train_epoch', 'before_train_iter', 'after_train_iter',
                'after_train_epoch', 'after_run')
VAL_STAGES = ('before_val_epoch', 'before_val_iter', 'after_val_iter', 'after_val_epoch')
CHECKPOINT_STAGES = ('before_save_checkpoint', 'after_load_checkpoint')
STAGES = (SETUP_STAGE,) + TRAIN_STAGES[:4] + VAL_STAGES + TRAIN_STAGES[4:] + CHECKPOINT_STAGES

# The stages Hook.next_call schedules, and its answer for "not again in this epoch".
ITERATION_STAGES = ('before_train_iter', 'after_train_iter')
NEVER = math.inf

# Specific stage -> the generic MMCV stage it falls back to.
GENERIC_STAGE = {
    'before_train_epoch': 'before_epoch', 'after_train_epoch': 'after_epoch',
    'before_val_epoch': 'before_epoch', 'after_val_epoch': 'after_epoch',
    'before_train_iter': 'before_iter', 'after_train_iter': 'after_iter',
    'before_val_iter': 'before_iter', 'after_val_iter': 'after_iter',
}


class Hook:
    """Base class of all hooks. Subclasses override stages; all take the trainer.

    Class attributes a hook may set:
      ``PRIORITY``  default priority (a :class:`Priority` or int) when none is given;
      ``ROLE``      what the hook does (``'optimizer'``, ``'lr'``, ``'ema'``,
                    ``'checkpoint'``, ``'logger'``, ...); ordering constraints and the
                    default hooks are expressed in roles (see ``hookloop.hooks.order``);
      ``EXCLUSIVE`` True when at most one hook of this role may be registered;
      ``RUNS_AFTER`` / ``RUNS_BEFORE``  roles this hook's role must follow / precede in
                    every stage both implement, whatever the priorities (``'*'`` in
                    ``RUNS_AFTER``: every other role). A user priority that contradicts
                    them is warned about at registration; the dependency wins.

    Life cycle: ``setup`` once per trainer (the first ``train()``/``val()`` that meets
    the hook), then per ``train()``: ``before_run`` ... ``after_run`` (docs/hooks.md).
    """

    PRIORITY = Priority.NORMAL
    ROLE = None
    EXCLUSIVE = False
    RUNS_AFTER = ()
    RUNS_BEFORE = ()

    # -- once per trainer ------------------------------------------------------------
    def setup(self, trainer):
        """Build what depends on the model and optimizer (EMA averages, the GradScaler).

        Called once per trainer, before the first ``before_run`` (or validation) this hook
        takes part in; a later ``train()`` (after a stop) keeps what was built here.
        """

    # -- generic stages (MMCV) -------------------------------------------------------
    def before_epoch(self, trainer):
        pass

    def after_epoch(self, trainer):
        pass

    def before_iter(self, trainer):
        pass

    def after_iter(self, trainer):
        pass

    # -- run -------------------------------------------------------------------------
    def before_run(self, trainer):
        pass

    def after_run(self, trainer):
        pass

    # -- train / val: by default delegate to the generic stages ------------------------
    def before_train_epoch(self, trainer):
        self.before_epoch(trainer)

    def after_train_epoch(self, trainer):
        self.after_epoch(trainer)

    def before_val_epoch(self, trainer):
        self.before_epoch(trainer)

    def after_val_epoch(self, trainer):
        self.after_epoch(trainer)

    def before_train_iter(self, trainer):
        self.before_iter(trainer)

    def after_train_iter(self, trainer):
        self.after_iter(trainer)

    def before_val_iter(self, trainer):
        self.before_iter(trainer)

    def after_val_iter(self, trainer):
        self.after_iter(trainer)

    # -- checkpoints -------------------------------------------------------------------
    def before_save_checkpoint(self, trainer, checkpoint):
        """Called with the checkpoint dict before it is written; may add top-level entries."""

    def after_load_checkpoint(self, trainer, checkpoint):
        """Called with the loaded checkpoint dict after the trainer restored its state."""

    # -- when the iteration stages have work -------------------------------------------------
    def next_call(self, trainer, stage, start):
        """The first iteration (in ``trainer.iter`` units) at or after ``start`` at which this
        hook's ``stage`` (``'before_train_iter'`` or ``'after_train_iter'``) must be called;
        ``NEVER`` for none in the current epoch; None (the default) for every iteration.

        The trainer asks at the start of every epoch (``start``: its first iteration to run),
        right after each call of the hook at either iteration stage (``start``: the next
        iteration reaching the stage) and when ``trainer.replan(hook)`` asks (after something
        the answer depends on changed). The answer must not skip an iteration at which the
        stage would do something; work that depends on an event instead of the counters asks
        for a call in the next iteration with ``trainer.wake(self)``. A subclass overriding a
        method this ``next_call`` was not written for runs at every iteration (docs/hooks.md).
        Helpers: :meth:`next_every_n_iters`, :meth:`next_every_n_inner_iters`,
        :meth:`epoch_end_iter`.
        """
        return None

    @staticmethod
    def next_every_n_iters(start, n):
        """The first iteration at or after ``start`` that completes a multiple of ``n``
        global iterations (where :meth:`every_n_iters` is true)."""
        return start + (-(start + 1)) % n

    @staticmethod
    def next_every_n_inner_iters(trainer, start, n):
        """The first iteration at or after ``start`` that completes a multiple of ``n``
        iterations of the current epoch (:meth:`every_n_inner_iters`); ``NEVER`` when that
        is past the epoch's end."""
        first = trainer.iter - trainer.inner_iter  # the epoch's first iteration
        found = first + Hook.next_every_n_iters(max(start - first, 0), n)
        return found if found <= Hook.epoch_end_iter(trainer) else NEVER

    @staticmethod
    def epoch_end_iter(trainer):
        """The current epoch's last iteration (where :meth:`end_of_epoch` is true)."""
        return trainer.iter - trainer.inner_iter + trainer.epoch_length - 1

    def get_triggered_stages(self):
        """MMCV's: the stages this hook does something at, in MMCV's order (a generic
        ``before_epoch`` / ``after_iter`` ... counts for the train and the val stage)."""
        order = ('before_run', 'before_train_epoch', 'before_train_iter', 'after_train_iter', 'after_train_epoch',
                 'before_val_epoch', 'before_val_iter', 'after_val_iter', 'after_val_epoch', 'after_run')
        return [stage for stage in order if overrides(self, stage)]

    # -- what the hook writes where ----------------------------------------------------------
    def output_dirs(self, trainer):
        """The directories this hook writes into, ``{kind: path}`` (``kind``: ``'checkpoint'``,
        ``'log'``, ``'pipeline'``, ...; ``path``: a user's relative ``out_dir`` joined to the storage
        dir for checkpoints, the local work dir otherwise; an absolute one as given). ``train()``
        checks each can be created before anything is written, refuses a relative one that ``..``
        takes out of the work dir, and logs and locks (like the work dir) one the user named
        outside it; the run summary and the resume search look for checkpoints in the
        ``'checkpoint'`` ones. Default: none."""
        return {}

    # -- identity ------------------------------------------------------------------------
    @property
    def name(self):
        """The key of this hook's state in checkpoints; the class name unless set."""
        return self.__dict__.get('_name', type(self).__name__)

    @name.setter
    def name(self, value):
        self.__dict__['_name'] = value

    # -- interval helpers (counters count *completed* iterations, see Trainer) ------------
    @staticmethod
    def every_n_iters(trainer, n):
        """True at the iteration that completes a multiple of ``n`` global iterations."""
        return n > 0 and (trainer.iter + 1) % n == 0

    @staticmethod
    def every_n_inner_iters(trainer, n):
        """True at the iteration that completes a multiple of ``n`` iterations of this epoch."""
        return n > 0 and (trainer.inner_iter + 1) % n == 0

    @staticmethod
    def every_n_epochs(trainer, n):
        """True in the epoch that completes a multiple of ``n`` epochs."""
        return n > 0 and (trainer.epoch + 1) % n == 0

    @staticmethod
    def end_of_epoch(trainer):
        """True at the last iteration of the current epoch (a shortened last epoch too)."""
        return trainer.inner_iter + 1 == trainer.epoch_length

    @staticmethod
    def is_last_iter(trainer):
        return trainer.iter + 1 == trainer.max_iters

    @staticmethod
    def is_last_epoch(trainer):
        return trainer.epoch + 1 == trainer.max_epochs


def overrides(hook, stage):
    """True when ``hook``'s class, or ``hook`` itself (``hook.after_train_iter = fn``), defines
    ``stage`` (or its generic fallback) instead of :class:`Hook`'s no-op."""
    cls, own = type(hook), getattr(hook, '__dict__', {})
    if stage in own or getattr(cls, stage, None) is not getattr(Hook, stage):
        return True
    generic = GENERIC_STAGE.get(stage)
    return generic is not None and (generic in own or getattr(cls, generic, None) is not getattr(Hook, generic))


def implemented_stages(hook):
    """The stages at which ``hook`` does something, in run order."""
    return [stage for stage in STAGES if overrides(hook, stage)]
