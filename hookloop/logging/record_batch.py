"""A tracker logger's records, handed to its library together instead of one log event at a time.

Inside the training loop a tracker library's call at each log event costs one to several
milliseconds: MLflow's store commits a transaction, DVCLive rewrites its files, TensorBoard's
writer wakes its thread to compete with the loop. So a tracker logger hook keeps the records
here (:meth:`RecordBatch.add`: an ``append``) and they are handed over, in order, by the log
:mod:`~hookloop.logging.flusher` once a second, at every flush point (epoch and validation ends,
checkpoint builds, ``after_run``) and when the logger stops (:meth:`RecordBatch.stop`).

One hand-over at a time: the flusher's thread and the logger's own calls into its library (its
images, :meth:`RecordBatch.exclusive`, after the records logged before them) take turns. A
failing hand-over is given to ``on_failure`` (maybe on the flusher's thread: the logger raises it
at its next call, :meth:`~hookloop.hooks.loggers.base.LoggerHook.keep_failure`).
"""
import contextlib
import threading
import time
from collections import deque

from . import flusher


class RecordBatch:
    """Records waiting for ``hand_over(records)``, which gets ``[(record, created), ...]`` in order
    (``created``: the event's ``time.time()``)."""

    def __init__(self, hand_over, on_failure):
        self._hand_over, self._on_failure = hand_over, on_failure
        self._records = deque()
        self._turn = threading.RLock()

    def start(self):
        flusher.register(self)

    def add(self, record):
        self._records.append((record, time.time()))

    def flush(self):
        """Hand over the records kept so far (the flusher's call)."""
        records = self._records
        if not records:
            return
        with self._turn:
            taken = []
            while records:  # (popleft: the loop may add meanwhile)
                taken.append(records.popleft())
            if taken:  # (another thread may have handed them over meanwhile)
                try:
                    self._hand_over(taken)
                except Exception as exc:
                    self._on_failure(exc)

    @contextlib.contextmanager
    def exclusive(self):
        """Around another call into the library: the records before it first, none during it."""
        with self._turn:
            self.flush()
            yield

    def stop(self):
        """Hand over what is left; no more flushes."""
        flusher.unregister(self)


__all__ = ['RecordBatch']
