"""A run's log-event lines, written in batches instead of one event at a time.

Inside a training loop a log event's formatting and writing cost several times what they
cost in a batch (measured in a run of a small model: 90-110 µs against 22-39 µs a line): the
training step between two events evicts that code and its data from the caches. So a logger
hook may hand a line over with what it needs to write it later (:meth:`LineBatch.defer`), and
the lines are written together, in the order they were handed over, on the
:mod:`~hookloop.logging.flusher`'s thread every :data:`~hookloop.logging.flusher.FLUSH_SECONDS`,
and at once wherever order or completeness is at stake:

* before any other record reaches the run's handlers (this object is a filter of each of them,
  so a checkpoint message, a warning, a child logger's record or a user's ``logger.info``
  comes after the lines logged before it, on the terminal and in the ``.log`` file alike);
* wherever the log files are flushed: epoch and validation ends, checkpoint builds,
  ``after_run``, a ``fork``, the interpreter's exit (:func:`~hookloop.logging.flusher.flush_logs`),
  and when a hook that defers lines closes (:meth:`LineBatch.leave`).

A line waits only while every handler of the logger is one of
:func:`~hookloop.logging.logger.create_logger`'s own, as it made them
(:func:`~hookloop.logging.logger.deferrable`, checked at every event): a user's handler gets each
record at its event, as ``logger.info`` gives it. A line is written to the handlers of its
event only, whatever the logger's level or handlers have become since.
"""
import logging
import threading
from collections import deque

from . import flusher


class LineBatch(logging.Filter):
    """The lines of one logger waiting to be written (a filter of its handlers: it writes them
    before any record goes to a handler the standard way)."""

    def __init__(self):
        super().__init__()
        self._lines = deque()  # (write, args): write(*args) writes one line
        self._users = 0
        self._lock = threading.RLock()  # one batch at a time; a line may log through the logger again
        self._writing = None  # the thread writing a batch

    def join(self):
        """A hook that defers lines starts (the batch is flushed by the flusher from then on)."""
        with self._lock:
            self._users += 1
            first = self._users == 1
        if first:  # (outside the lock: the flusher's thread takes its own lock, then this one)
            flusher.register(self, first=True)  # before the files it writes into are flushed

    def leave(self):
        """A hook that defers lines closes: what waits is written."""
        with self._lock:
            self.flush()
            self._users -= 1
            last = self._users == 0
        if last:
            flusher.unregister(self)

    def defer(self, write, *args):
        """Have ``write(*args)`` write a line, after the lines deferred before it."""
        self._lines.append((write, args))

    def flush(self):
        """Write the waiting lines now, in order (the flusher's call)."""
        lines = self._lines
        with self._lock:
            outer, self._writing = self._writing, threading.get_ident()
            try:
                while lines:  # (popleft: the loop may defer more meanwhile)
                    write, args = lines.popleft()
                    write(*args)
            finally:
                self._writing = outer

    def filter(self, record):
        # (not from inside a batch: a line written the standard way comes in its place)
        if self._lines and self._writing != threading.get_ident():
            self.flush()
        return True

    def _at_fork_reinit(self):
        """In a forked child: the thread that held the lock is not there."""
        self._lock = threading.RLock()
        self._writing = None
