"""A tracker logger's records, handed to its library together instead of one log event at a time.

Inside the training loop a tracker library's call at each log event costs one to several
milliseconds: MLflow's store commits a transaction, DVCLive rewrites its files, TensorBoard's
writer wakes its thread to compete with the loop. So a tracker logger hook keeps the records
here (:meth:`RecordBatch.add`) and they are handed over, in order, on the loop's thread: at the
first event :data:`~hookloop.logging.flusher.FLUSH_SECONDS` after the last hand-over, at every
flush point and exit of the :mod:`~hookloop.logging.flusher`, before the logger's other calls
into its library (:meth:`RecordBatch.exclusive`: its images come after the records logged before
them) and when the logger stops (:meth:`RecordBatch.stop`).

A failing hand-over is given to ``on_failure`` (the logger raises it at its next call,
:meth:`~hookloop.hooks.loggers.base.LoggerHook.keep_failure`: a flush point is no place for it).
"""
import contextlib
import time

from . import flusher


class RecordBatch:
    """Records waiting for ``hand_over(records)``, which gets ``[(record, created), ...]`` in order
    (``created``: the event's ``time.time()``)."""

    def __init__(self, hand_over, on_failure):
        self._hand_over, self._on_failure = hand_over, on_failure
        self._records = []
        self._last = time.monotonic()  # the last hand-over

    def start(self):
        self._last = time.monotonic()
        flusher.register(self)

    def add(self, record):
        self._records.append((record, time.time()))
        if time.monotonic() - self._last >= flusher.FLUSH_SECONDS:
            self.flush()

    def flush(self):
        """Hand over the records kept so far."""
        self._last = time.monotonic()
        if not self._records:
            return
        taken, self._records = self._records, []
        try:
            self._hand_over(taken)
        except Exception as exc:
            self._on_failure(exc)

    @contextlib.contextmanager
    def exclusive(self):
        """Around another call into the library: the records before it first."""
        self.flush()
        yield

    def stop(self):
        """Hand over what is left; no more flushes."""
        flusher.unregister(self)
        self.flush()  # (also records added after a fork, in a child that forgot the registration)


__all__ = ['RecordBatch']
