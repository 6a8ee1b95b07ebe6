"""PreemptionHook: on SIGTERM / SIGINT, finish the iteration, save, and stop cleanly."""
import os
import signal
import threading

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook

_SIGNALS = {'SIGTERM': signal.SIGTERM, 'SIGINT': signal.SIGINT}
if hasattr(signal, 'SIGUSR1'):
    _SIGNALS['SIGUSR1'] = signal.SIGUSR1


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Turns a termination signal into a clean stop with a checkpoint.

    Registered by default whenever the run has a checkpoint hook; register it yourself to
    change ``signals`` or to stop without saving (``save=False``).

    On the first signal the trainer finishes the iteration in progress (the signal handler
    only records a stop request, so no work is cut in half), then this hook saves
    ``preempt_iter_{n}.pth`` (n = completed iterations), moves ``last_checkpoint`` to it and
    the run ends normally: ``after_run`` of every hook runs, so loggers flush and close, and
    ``hookloop train`` exits with status 0. ``--resume auto`` continues from there.
    A second signal aborts at once with the signal's default action (no save, no traceback).

    With several ranks the stop is agreed: after each iteration every rank starts a
    non-blocking all-reduce (MAX, on a CPU gloo group of its own) of "I got a signal" and
    reads the previous iteration's result, which has long arrived. So all ranks stop after
    the same iteration, one iteration after the first of them got the signal, and no rank
    waits on the others in a step that has nothing to do with the signal.

    Args:
        signals: names of the signals to catch (default SIGTERM and SIGINT; SIGUSR1 too
            where it exists, e.g. for SLURM's ``--signal=USR1@60``).
        save: save a checkpoint on the way out (default True).

    Handlers are installed in ``before_run`` and the previous ones restored in ``after_run``,
    where a handled signal is also forgotten (a later ``train()`` runs normally). Python only
    runs signal handlers in the main thread, so in another thread the hook does nothing.
    """

    PRIORITY = Priority.NORMAL
    ROLE = 'preemption'

    def __init__(self, signals=('SIGTERM', 'SIGINT'), save=True):
        if isinstance(signals, str):
            signals = [signals]
        unknown = [s for s in signals if s not in _SIGNALS]
        if unknown:
            raise ConfigError(f'PreemptionHook signals: unknown {unknown}; known: {sorted(_SIGNALS)}')
        self.signals = [_SIGNALS[s] for s in signals]
        self.save = save
        self.received = None    # the signal this process got, by name
        self.stopping = False   # the stop this run agreed on (every rank alike)
        self._previous = {}
        self._group = self._pending = self._flag = None

    def before_run(self, trainer):
        self.received, self.stopping = None, False
        self._trainer = trainer
        if trainer.world_size > 1:
            import torch.distributed as dist
            # A gloo group of our own: the flag is a CPU tensor whatever the training
            # backend, so reading it never waits for a device.
            self._group = dist.new_group(backend='gloo')
        if threading.current_thread() is not threading.main_thread():
            trainer.logger.warning('PreemptionHook: not in the main thread, signals are not caught')
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        if self.received is not None:  # second signal: give up at once, as the user asks
            self._restore()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signal.Signals(signum).name
        if self._group is None:  # one process: nobody to agree with
            self._stop(self._trainer, f'received {self.received}')

    def _stop(self, trainer, reason):
        self.stopping = True
        trainer.request_stop(reason)

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        return NEVER if self._group is None else None  # one process: the signal handler stops the run

    def after_train_iter(self, trainer):
        if self._group is None:
            return
        import torch
        import torch.distributed as dist
        if self._pending is not None:
            self._pending.wait()  # started one iteration ago: already complete
            self._pending = None
            if int(self._flag[0]) > 0:
                why = f'received {self.received}' if self.received else 'another rank received a signal'
                self._stop(trainer, why)
                return
        self._flag = torch.tensor([1 if self.received else 0], dtype=torch.int32)
        self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)

    def after_run(self, trainer):
        try:
            # Every rank started the last all-reduce: finish it together (after an error a
            # peer may be gone, so do not wait then).
            if self._pending is not None and not trainer.outcome.failed:
                self._pending.wait()
            self._pending = None
            if self.stopping and self.save and not trainer.outcome.failed:
                epoch, it, _ = trainer.position.resume_point()
                path = trainer.save_checkpoint(f'preempt_iter_{it}.pth')
                trainer.logger.info('%s: saved %s at epoch %d, iteration %d; continue with --resume auto',
                                    self.received or 'signal on another rank', path, epoch, it)
        finally:
            self._restore()
            self._trainer = None  # (no cycle left through the trainer: a dropped one is freed at once)
            self.received, self.stopping = None, False
            if self._group is not None:
                import torch.distributed as dist
                dist.destroy_process_group(self._group)
                self._group = None

    def _restore(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
