"""WorkDirLockHook: a run whose work dir lock was taken away stops at once, writing nothing more."""
from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook


@HOOKS.register_module()
class WorkDirLockHook(Hook):
    """Checks, on rank 0, that the work dir's lock file is still the one this run holds
    (``trainer.workspace.check_lock()``) after every ``interval``-th training iteration and
    after each validation: the log events of the run. Deleting or replacing the lock file under
    a live run lets a second run take the dir; this run then stops with one line within an
    interval, before its loggers and its checkpoint hook write again (checkpoint writes check
    the lock too). Registered by default with ``log_config``'s interval; the check is one ``lstat``.

    Args:
        interval: check every ``interval`` training iterations (default 10, as the loggers'; 1 for
            every iteration).
    """

    PRIORITY = Priority.NORMAL  # RUNS_BEFORE puts it ahead of the writers
    ROLE = 'work_dir_lock'
    EXCLUSIVE = True
    RUNS_BEFORE = ('checkpoint', 'logger', 'evaluation')

    def __init__(self, interval=10):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'WorkDirLockHook: interval must be a positive int, got {interval!r}')
        self.interval = interval

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter' or trainer.rank != 0:
            return NEVER  # only rank 0 holds the lock
        return self.next_every_n_iters(start, self.interval)

    def after_train_iter(self, trainer):
        if self.every_n_iters(trainer, self.interval):
            trainer.workspace.check_lock()

    def after_val_epoch(self, trainer):
        trainer.workspace.check_lock()
