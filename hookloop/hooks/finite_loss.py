"""FiniteLossGuard: by default, a NaN/Inf loss stops the run instead of ending it silently.

It looks only at numbers that are on the host already or about to be synced anyway:

* at a log event, the summary the loggers computed; a bad loss there stops the run in the
  next iteration, before its optimizer step;
* before every checkpoint is written, the loss values since its previous look (a save
  syncs the whole model anyway), so a checkpoint never holds weights that a non-finite
  loss has reached, and ``last_checkpoint`` keeps naming the last good one;
* after the last iteration.

So it costs no host sync on other iterations, and is not even called there: it looks at each
new summary as a meter listener (``MeterBuffer.add_listener``) and, when one holds a bad loss,
has itself called at the next iteration (``Trainer.wake``). A registered ``CheckInvalidLossHook`` (same
role, per-step policies ``raise``/``skip``/``rollback``) replaces it.
"""
import math

from ..errors import InvalidLossError
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook


def non_finite_losses(summary):
    """``{key: value}`` of the loss keys of a meter summary whose average or latest value is
    NaN or infinite."""
    bad = {}
    for key, stats in summary.items():
        if key.startswith('loss'):
            for field in ('avg', 'latest'):
                if not math.isfinite(stats[field]):
                    bad[key] = stats[field]
                    break
    return bad


@HOOKS.register_module()
class FiniteLossGuard(Hook):
    PRIORITY = Priority.VERY_LOW
    ROLE = 'invalid_loss'
    RUNS_BEFORE = ('optimizer',)  # a bad loss seen at a log event stops the run before the next step

    def __init__(self):
        self._mark = self._logged_bad = self._listener = None

    def before_run(self, trainer):
        self._mark = trainer.meters.mark()
        self._logged_bad = None
        self._listener = lambda summary: self._look(trainer, summary)
        trainer.meters.add_listener(self._listener)

    def after_run(self, trainer):
        trainer.meters.remove_listener(self._listener)

    def _look(self, trainer, summary):
        """A new summary (a log event): if it holds a bad loss, stop at the next iteration,
        before its step (not here: the loggers are still writing it out)."""
        if self._logged_bad is None and non_finite_losses(summary):
            self._logged_bad = (summary, trainer.position.resume_point()[1])
            trainer.wake(self)

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        last = trainer.max_iters - 1
        return last if start <= last else NEVER

    def after_train_iter(self, trainer):
        if self._logged_bad is not None:
            summary, iterations_done = self._logged_bad
            self._raise_if_bad(trainer, summary, iterations_done, 'logged')
        if self.is_last_iter(trainer):
            self._check_since_last_look(trainer, trainer.iter + 1)

    def before_save_checkpoint(self, trainer, checkpoint):
        self._check_since_last_look(trainer, checkpoint['meta']['iter'])

    def _check_since_last_look(self, trainer, iterations_done):
        summary = trainer.meters.summary(self._mark)  # on every rank: may all-reduce
        self._mark = trainer.meters.mark()
        self._raise_if_bad(trainer, summary, iterations_done, 'seen before saving')

    def _raise_if_bad(self, trainer, summary, iterations_done, how):
        bad = non_finite_losses(summary)
        if not bad:
            return
        values = ', '.join(f'{k}={v}' for k, v in sorted(bad.items()))
        raise InvalidLossError(
            f'non-finite loss ({values}) {how} by iteration {iterations_done} (epoch {trainer.epoch + 1}); '
            'training stopped and no checkpoint was written with it: last_checkpoint still names the last '
            'good one. Register CheckInvalidLossHook(on_invalid="skip" or "rollback") to train through bad '
            'batches')
