"""A run's log-event lines, written in batches instead of one event at a time.

Inside a training loop a log event's formatting and writing cost several times what they
cost in a batch (measured in a run of a small model: 90-110 µs against 22-39 µs a line): the
training step between two events evicts that code and its data from the caches. So a logger
hook may hand its lines over with what it needs to write them later
(:meth:`LineBatch.add_writer`), and they are written together on the :mod:`~hookloop.logging.flusher`'s thread every
:data:`~hookloop.logging.flusher.FLUSH_SECONDS`, and at once wherever order or completeness
is at stake:

* before any other record reaches the logger's handlers (this object is a filter of the run's
  logger, so a checkpoint message or a user's ``logger.info`` comes after the lines logged
  before it, on the terminal and in the ``.log`` file alike);
* wherever the log files are flushed: epoch and validation ends, checkpoint builds,
  ``after_run``, a ``fork`` (:func:`~hookloop.logging.flusher.flush_logs`), and when the writer
  is removed (its logger hook closes).

The lines are the ones an immediate write gives, byte for byte (the time in each is the
event's). A line waits only while every handler of the logger is one of
:func:`~hookloop.logging.logger.create_logger`'s own (:func:`~hookloop.logging.logger.batch_of`):
a user's handler gets each record at its event, as ``logger.info`` gives it.
"""
import logging
import threading

from . import flusher


class LineBatch(logging.Filter):
    """The writers with unwritten lines of one logger (a filter of that logger: it writes them
    before any record goes through the logger the standard way)."""

    def __init__(self):
        super().__init__()
        self._writers = []
        self._lock = threading.RLock()  # one batch at a time; a writer may log through the logger again
        self._writing = None  # the thread writing a batch
        # The logger's handler list when last checked, and whether they all were hookloop's own
        # (:func:`~hookloop.logging.logger.batch_of` keeps them).
        self.handlers_seen = self.all_own = None

    def add_writer(self, writer):
        """Have ``writer()`` write what it holds at every flush, until :meth:`remove_writer`."""
        with self._lock:
            self._writers.append(writer)
            first = len(self._writers) == 1
        if first:  # (outside the lock: the flusher's thread takes its own lock, then this one)
            flusher.register(self, first=True)  # before the files it writes into are flushed

    def remove_writer(self, writer):
        """Write what ``writer`` holds and stop calling it."""
        with self._lock:
            if writer not in self._writers:
                return
            self._write((writer,))
            self._writers.remove(writer)
            last = not self._writers
        if last:
            flusher.unregister(self)

    def write_now(self, writer):
        """Write what ``writer`` holds now, in turn with the batches."""
        self._write((writer,))

    def flush(self):
        """Write every writer's lines now (the flusher's call)."""
        self._write(list(self._writers))

    def _write(self, writers):
        with self._lock:
            outer, self._writing = self._writing, threading.get_ident()
            try:
                for writer in writers:
                    writer()
            finally:
                self._writing = outer

    def filter(self, record):
        # (not from inside a batch: a writer's own line through the standard path comes in its place)
        if self._writers and self._writing != threading.get_ident():
            self.flush()
        return True

