"""The per-iteration step state: what hooks tell each other about the current step.

One object, ``trainer.step``, replaces the ad-hoc trainer attributes hooks once used to
talk to each other. Each field has one writer and documented readers:

* ``forward_context`` (``() -> context manager``): written by the optimizer hook in
  ``before_train_iter`` (autocast; DDP ``no_sync`` inside an accumulation window); the
  trainer enters it around the training forward.
* ``val_forward_context`` (``() -> context manager``): written by the optimizer hook at
  ``setup`` (autocast for fp16/bf16); the trainer enters it around each validation forward.
* ``skip_reason`` (``str`` or ``None``): written by any hook through :meth:`StepState.skip`
  in ``after_train_iter`` (``CheckInvalidLossHook``); read by the optimizer hook, which then
  neither back-propagates nor steps at the end of the window.
* ``data_seconds`` (``float``): the seconds this trainer's training loop has waited for
  batches (fetch and move to the device), written by the trainer; ``IterTimerHook``
  turns it into ``data_time``.
* ``epoch_length`` (``int``): the iterations of the current epoch, written by the trainer
  as each epoch starts.
* ``accumulation`` (``int``): the iterations the optimizer hook accumulates gradients over,
  written at its set-up; ``window`` (``(start, size)`` in ``inner_iter`` units) is the
  accumulation window of the current iteration, derived from it and the position
  (:func:`accumulation_window`); read-only for others.
* ``loss_scaling`` (``bool``): written by the optimizer hook at set-up, True when a GradScaler
  scales the loss (fp16): a step with inf/NaN gradients is then skipped by the scaler, and the
  hook publishes ``skipped_steps`` (steps skipped in a row) in the meters; the invalid-loss
  guard reads both.

The trainer clears ``skip_reason`` after an iteration that set it and at every epoch's start
(:meth:`StepState.begin`), so a decision never leaks into the next iteration, whichever hook
made it.
"""
import contextlib

from ..optim.accumulation import accumulation_window


class StepState:
    """The state of the training iteration being run (see the module docstring);
    ``position`` is the trainer's :class:`~hookloop.engine.position.Position`."""

    __slots__ = ('forward_context', 'val_forward_context', 'skip_reason', 'data_seconds', 'epoch_length',
                 'accumulation', 'loss_scaling', '_position')

    def __init__(self, position, epoch_length=0):
        self.forward_context = contextlib.nullcontext
        self.val_forward_context = contextlib.nullcontext
        self.skip_reason = None
        self.data_seconds = 0.0
        self.accumulation = 1
        self.loss_scaling = False  # the optimizer hook scales the loss (fp16 GradScaler): see below
        self.epoch_length = epoch_length
        self._position = position

    @property
    def window(self):
        """``(start, size)`` of the current iteration's accumulation window."""
        return accumulation_window(self._position.inner_iter, self.epoch_length, self.accumulation)

    def begin(self):
        """Forget the skip decision (the trainer calls it; see the module docstring)."""
        self.skip_reason = None

    def skip(self, reason):
        """Drop this iteration's update: no backward, and the accumulation window that holds
        it ends without an optimizer step. The trainer frees the iteration's graph at once."""
        self.skip_reason = str(reason)

    @property
    def skipped(self):
        return self.skip_reason is not None


__all__ = ['StepState']
