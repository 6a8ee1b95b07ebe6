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
* ``window`` (``(start, size)`` in ``inner_iter`` units): the accumulation window of this
  iteration, written by the optimizer hook in ``before_train_iter``; read-only for others.

The trainer clears ``skip_reason`` before every iteration (:meth:`StepState.begin`), so a
decision never leaks into the next iteration, whichever hook made it.
"""
import contextlib


class StepState:
    """The state of the training iteration being run (see the module docstring)."""

    __slots__ = ('forward_context', 'val_forward_context', 'skip_reason', 'window')

    def __init__(self):
        self.forward_context = contextlib.nullcontext
        self.val_forward_context = contextlib.nullcontext
        self.skip_reason = None
        self.window = (0, 1)

    def begin(self):
        """Called by the trainer before ``before_train_iter``: a fresh decision each iteration."""
        self.skip_reason = None

    def skip(self, reason):
        """Drop this iteration's update: no backward, and the accumulation window that holds
        it ends without an optimizer step. The trainer frees the iteration's graph at once."""
        self.skip_reason = str(reason)

    @property
    def skipped(self):
        return self.skip_reason is not None


__all__ = ['StepState']
