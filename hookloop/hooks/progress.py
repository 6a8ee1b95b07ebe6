"""ProgressBarHook: a tqdm bar over the run's iterations, for people watching a terminal."""
import sys

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


@HOOKS.register_module()
class ProgressBarHook(Hook):
    """A tqdm bar counting training iterations (``n/max_iters``, rate, ETA).

    It is shown only on rank 0 and only when stdout is a terminal (``enabled='auto'``), so
    CI logs and non-zero ranks stay clean. While it is shown, the run's logger writes
    through ``tqdm.write`` (``tqdm.contrib.logging``), so a log line never lands inside the
    bar and the ``.log`` file is unaffected. The bar costs one Python call per iteration
    and never reads a tensor.

    Args:
        enabled: ``'auto'`` (terminal and rank 0), True (rank 0, any stream), False.
        file: the stream to draw on; default ``sys.stdout``.
        mininterval: the least seconds between redraws (tqdm's).
    """

    PRIORITY = Priority.VERY_LOW
    ROLE = 'progress'

    def __init__(self, enabled='auto', file=None, mininterval=0.5):
        if enabled not in ('auto', True, False):
            raise ConfigError(f"ProgressBarHook enabled must be 'auto', True or False, got {enabled!r}")
        try:
            import tqdm  # noqa: F401
        except ImportError:
            raise ConfigError('ProgressBarHook needs the tqdm package: pip install tqdm') from None
        self.enabled, self.file, self.mininterval = enabled, file, mininterval
        self.bar = None
        self._redirect = None

    def _active(self, trainer):
        if trainer.rank != 0 or self.enabled is False:
            return False
        stream = self.file or sys.stdout
        return self.enabled is True or (hasattr(stream, 'isatty') and stream.isatty())

    def before_run(self, trainer):
        if not self._active(trainer):
            return
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm
        self._redirect = logging_redirect_tqdm(loggers=[trainer.logger])
        self._redirect.__enter__()
        self.bar = tqdm(total=trainer.max_iters, file=self.file or sys.stdout, mininterval=self.mininterval,
                        dynamic_ncols=True, unit='it', desc='train')

    def after_train_iter(self, trainer):
        if self.bar is not None:
            # the counters are 0-based during after_train_iter; a resume starts the bar late
            self.bar.update(trainer.iter + 1 - self.bar.n)

    def after_run(self, trainer):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
