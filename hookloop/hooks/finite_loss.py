"""FiniteLossGuard: by default, a NaN/Inf loss stops the run instead of ending it silently.

It looks only at numbers that are on the host already or about to be synced anyway:

* at a log event, the summary the loggers computed; a bad loss there stops the run in the
  next iteration, before its optimizer step;
* before every checkpoint is written, this rank's loss values since its previous look (a save
  syncs the whole model anyway; no collective, as rank 0 may save alone), so a checkpoint
  never holds weights that a non-finite loss has reached, and ``last_checkpoint`` keeps
  naming the last good one;
* at the end of every epoch (one look per epoch: a bad value is acted on within one log
  interval also when the log events and the epoch ends do not line up);
* after the last iteration.

So it costs no host sync on other iterations, and is not even called there: it looks at each
new summary as a meter listener (``MeterBuffer.add_listener``) and, when one holds a bad loss,
has itself called at the next iteration (``Trainer.wake``). A registered ``CheckInvalidLossHook`` (same
role, per-step policies ``raise``/``skip``/``rollback``) replaces it; the checkpoints stay
protected either way (``hookloop/checkpoint/finite_state.py``: no checkpoint with a non-finite state).

With fp16 loss scaling (``trainer.step.loss_scaling``) a non-finite loss is not a failure:
the GradScaler skips that step and lowers the scale, as a plain AMP loop does. A dead run is:
``max_skipped_steps`` steps in a row skipped (the ``skipped_steps`` meter of the optimizer
hook), or the loss scale below ``min_loss_scale``.

Messages count iterations one way only: completed training iterations of the whole run.
"""
import functools
import math

from ..errors import ConfigError, InvalidLossError
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

    def __init__(self, max_skipped_steps=20, min_loss_scale=1e-4):
        if isinstance(max_skipped_steps, bool) or not isinstance(max_skipped_steps, int) or max_skipped_steps < 1:
            raise ConfigError(f'FiniteLossGuard max_skipped_steps must be a positive int, got {max_skipped_steps!r}')
        if isinstance(min_loss_scale, bool) or not isinstance(min_loss_scale, (int, float)) or \
                not 0 <= min_loss_scale < math.inf:
            raise ConfigError(f'FiniteLossGuard min_loss_scale must be a number >= 0, got {min_loss_scale!r}')
        self.max_skipped_steps, self.min_loss_scale = max_skipped_steps, float(min_loss_scale)
        self._mark = self._logged_bad = self._listener = self._seen_at = None

    def before_run(self, trainer):
        self._mark = trainer.meters.mark()
        self._logged_bad = None
        self._listener = functools.partial(self._look, trainer)  # (a C call: no Python frame of its own)
        trainer.meters.add_listener(self._listener)

    def after_run(self, trainer):
        trainer.meters.remove_listener(self._listener)
        self._listener = None  # (it holds the trainer: no cycle left, a dropped trainer is freed at once)

    def _look(self, trainer, summary):
        """A new summary (a log event): if it holds a bad loss, stop at the next iteration,
        before its step (not here: the loggers are still writing it out)."""
        self._seen_at = trainer.position.resume_point()[1]
        if self._logged_bad is None and self._failure(trainer, summary):
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

    def after_train_epoch(self, trainer):
        done = trainer.position.resume_point()[1]
        if self._seen_at != done:  # not when a log event just looked at this very iteration
            self._check_since_last_look(trainer, done, 'seen at the end of an epoch')

    def before_save_checkpoint(self, trainer, checkpoint):
        # this rank's own losses, no collective: rank 0 may save alone (MMCV's @master_only)
        self._check_since_last_look(trainer, checkpoint['meta']['iter'], across_ranks=False)

    def _check_since_last_look(self, trainer, iterations_done, how='seen before saving', across_ranks=True):
        # across ranks at the stages every rank reaches together (an epoch's end, the last iteration)
        summary, self._mark = trainer.meters.summary_and_mark(self._mark, across_ranks)
        self._raise_if_bad(trainer, summary, iterations_done, how)

    def _failure(self, trainer, summary):
        """What in ``summary`` means the run has gone bad (a phrase), or None."""
        if not trainer.step.loss_scaling:
            bad = non_finite_losses(summary)
            return 'non-finite loss (' + ', '.join(f'{k}={v}' for k, v in sorted(bad.items())) + ')' if bad else None
        skipped = summary.get('skipped_steps', {}).get('latest', 0)
        if skipped >= self.max_skipped_steps:
            return (f'{int(skipped)} optimizer steps in a row skipped by the GradScaler for inf/NaN gradients '
                    f'(max_skipped_steps={self.max_skipped_steps})')
        scale = summary.get('loss_scale', {}).get('latest', math.inf)
        if scale < self.min_loss_scale:
            return f'loss scale {scale:.3g} below min_loss_scale={self.min_loss_scale:g}'
        return None

    def _raise_if_bad(self, trainer, summary, iterations_done, how):
        bad = self._failure(trainer, summary)
        if not bad:
            return
        raise InvalidLossError(
            f'{bad} {how} by iteration {iterations_done} of {trainer.max_iters}; training stopped and no '
            'checkpoint was written with it: last_checkpoint still names the last good one. Register '
            'CheckInvalidLossHook(on_invalid="skip" or "rollback") to train through bad batches')
