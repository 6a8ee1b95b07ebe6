"""PreemptionHook: on SIGTERM / SIGINT, finish the iteration, save, and stop cleanly."""
import os
import signal
import threading

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import Hook

_SIGNALS = {'SIGTERM': signal.SIGTERM, 'SIGINT': signal.SIGINT}
if hasattr(signal, 'SIGUSR1'):
    _SIGNALS['SIGUSR1'] = signal.SIGUSR1


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Turns a termination signal into a clean stop with a checkpoint.

    On the first signal the trainer finishes the iteration in progress (the signal handler
    only records a stop request, so no work is cut in half), then this hook saves
    ``preempt_iter_{n}.pth`` (n = completed iterations), moves ``last_checkpoint`` to it and
    the run ends normally: ``after_run`` of every hook runs, so loggers flush and close, and
    ``hookloop train`` exits with status 0. ``--resume auto`` continues from there.
    A second signal aborts at once with the signal's default action (no save).

    Args:
        signals: names of the signals to catch (default SIGTERM and SIGINT; SIGUSR1 too
            where it exists, e.g. for SLURM's ``--signal=USR1@60``).
        save: save a checkpoint on the way out (default True).

    Handlers are installed in ``before_run`` and the previous ones restored in ``after_run``;
    Python only runs signal handlers in the main thread, so in another thread the hook
    warns and does nothing. Each rank reacts to its own signal; with several processes
    send the signal to all of them (torchrun and SLURM do).
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
        self.received = None
        self._previous = {}

    def before_run(self, trainer):
        if threading.current_thread() is not threading.main_thread():
            trainer.logger.warning('PreemptionHook: not in the main thread, signals are not caught')
            return
        self._trainer = trainer
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        if self.received is not None:  # second signal: give up at once, as the user asks
            self._restore()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signal.Signals(signum).name
        self._trainer.request_stop(f'received {self.received}')

    def after_run(self, trainer):
        try:
            if self.received is not None and self.save and trainer.exception is None:
                epoch, it, _ = trainer.position.resume_point()
                path = trainer.save_checkpoint(f'preempt_iter_{it}.pth')
                trainer.logger.info('%s: saved %s at epoch %d, iteration %d; continue with --resume auto',
                                    self.received, path, epoch, it)
        finally:
            self._restore()

    def _restore(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
