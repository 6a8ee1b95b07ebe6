"""The run's Python logger: terminal plus ``<work_dir>/<timestamp>.log`` on rank 0."""
import logging
import os
import sys
import time

from . import flusher
from .line_batch import LineBatch

_FORMAT = '%(asctime)s - hookloop - %(levelname)s - %(message)s'


def create_logger(work_dir, timestamp, rank=0, level='INFO'):
    """A fresh logger for one trainer. Other ranks print warnings and errors only."""
    logger = logging.getLogger(f'hookloop.{timestamp}.{id(work_dir)}')
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    if line_batch(logger) is not None:
        logger.removeFilter(line_batch(logger))
    logger.addFilter(LineBatch())  # the log events' lines wait here (a run's logger hooks add them)
    logger.setLevel(level if rank == 0 else logging.WARNING)
    formatter = logging.Formatter(_FORMAT)
    formatter.hookloop_line = True  # lines for this formatter may be written by :func:`info_line`
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(formatter)
    logger.addHandler(stream)
    if rank == 0 and work_dir is not None:
        file_handler = DeferredFileHandler(os.path.join(work_dir, f'{timestamp}.log'))
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


class DeferredFileHandler(logging.Handler):
    """A log file that is created only when the run starts (:func:`start_log_file`).

    Records before that are kept and written first, so a trainer whose build fails, or a
    run that finds nothing to do, leaves no empty ``.log`` behind. A record through the standard
    path is flushed at once (as ``logging.FileHandler`` does); a log event's line
    (:func:`info_line`) waits for the :mod:`~hookloop.logging.flusher`."""

    def __init__(self, path):
        super().__init__()
        self.path = self.baseFilename = path
        self._pending = []
        self._file = None

    def start(self):
        if self._file is None:
            self._file = logging.FileHandler(self.path, encoding='utf-8')
            self._file.setFormatter(self.formatter)
            for record in self._pending:
                self._file.handle(record)
            self._pending = []
            flusher.register(self._file)

    def emit(self, record):
        if self._file is not None:
            self._file.handle(record)
        else:
            self._pending.append(record)

    def flush(self):
        if self._file is not None:
            self._file.flush()

    def close(self):
        if self._file is not None:
            flusher.unregister(self._file)
            self._file.close()
        self._pending = []
        super().close()


def start_log_file(logger):
    """Create the log file of ``logger`` (rank 0) and write what was logged so far."""
    for handler in logger.handlers:
        if isinstance(handler, DeferredFileHandler):
            handler.start()


def close_logger(logger):
    batch = line_batch(logger)
    if batch is not None:
        batch.flush()
        logger.removeFilter(batch)
    for handler in list(logger.handlers):
        handler.flush()
        handler.close()
        logger.removeHandler(handler)


# -- the log events' fast path ------------------------------------------------------------
_TIME_FORMAT = logging.Formatter.default_time_format
_MSEC_FORMAT = logging.Formatter.default_msec_format
_seconds = [None, None, None]  # (whole second, converter, its strftime): one strftime per second


def _direct(handler):
    """The stream handler that writes the lines of one of :func:`create_logger`'s own
    handlers, when a line can be written to its stream as it would write it itself, else None
    (a user's handler, or one changed since)."""
    if handler.filters:
        return None
    if type(handler) is DeferredFileHandler:
        handler = handler._file
        if handler is None or handler.filters or logging.INFO < handler.level:
            return None  # not started yet: the handler keeps the record for later
    elif type(handler) is not logging.StreamHandler:
        return None
    formatter = handler.formatter  # still the one create_logger made, as it made it
    if handler.stream is None or handler.terminator != '\n' or type(formatter) is not logging.Formatter \
            or not getattr(formatter, 'hookloop_line', False) or formatter._fmt != _FORMAT \
            or formatter.datefmt is not None or formatter.default_time_format != _TIME_FORMAT \
            or formatter.default_msec_format != _MSEC_FORMAT:
        return None
    return handler


def line_batch(logger):
    """The :class:`~hookloop.logging.line_batch.LineBatch` :func:`create_logger` gave ``logger``, or None."""
    for batch in logger.filters:
        if type(batch) is LineBatch:
            return batch
    return None


def batch_of(logger):
    """The :class:`~hookloop.logging.line_batch.LineBatch` of ``logger`` when a log event's
    lines may wait in it: a logger :func:`create_logger` made, whose handlers (checked again
    whenever the list changes) are all its own as it made them (a user's handler gets each
    record at its event). Else None."""
    batch = line_batch(logger)
    if batch is None:
        return None
    if logger.handlers != batch.handlers_seen:
        batch.handlers_seen = list(logger.handlers)
        batch.all_own = all(_direct(handler) is not None for handler in batch.handlers_seen)
    return batch if batch.all_own else None


def _foreign_filters(logger):
    return any(type(f) is not LineBatch for f in logger.filters)


def _asctime(created, converter):
    second = int(created)
    cached = _seconds
    if cached[0] != second or cached[1] is not converter:
        cached[:] = second, converter, time.strftime(_TIME_FORMAT, converter(created))
    return _MSEC_FORMAT % (cached[2], int((created - second) * 1000))


def info_line(logger, message, created=None):
    """``logger.info(message)`` for a run's logger, cheaper (a log event's line), stamped
    ``created`` (a ``time.time()``; default: now).

    The handlers :func:`create_logger` made get the line they would write, formatted once for
    all of them, without a ``LogRecord``; any other handler (a user's) gets the record as
    usual, with the same creation time. A logger or handler changed in a way this does not
    reproduce (a filter of its own, another formatter or level) takes the standard path."""
    if not logger.isEnabledFor(logging.INFO):
        return
    if logger.disabled or not logger.handlers or (logger.filters and _foreign_filters(logger)):
        logger.handle(_record(logger, message, created, sys._getframe(1)))
        return
    handlers, record = [], None
    for handler in logger.handlers:
        if logging.INFO >= handler.level:
            direct = _direct(handler)
            handlers.append((handler, direct))
            if direct is None and record is None:
                record = _record(logger, message, created, sys._getframe(1))
    if record is not None:
        created = record.created
    elif created is None:
        created = time.time()
    line = converter = None
    for handler, direct in handlers:
        if direct is None:
            handler.handle(record)
            continue
        if direct.formatter.converter is not converter:
            converter = direct.formatter.converter
            line = f'{_asctime(created, converter)} - hookloop - {logging.getLevelName(logging.INFO)} - {message}\n'
        try:
            with direct.lock:
                direct.stream.write(line)
                if direct is handler:  # the terminal at once; the .log file (a DeferredFileHandler's) by the flusher
                    direct.stream.flush()
        except RecursionError:
            raise
        except Exception:  # as logging.StreamHandler.emit does
            if record is None:
                record = _record(logger, message, created, sys._getframe(0))
            handler.handleError(record)


def _record(logger, message, created, frame):
    """The ``LogRecord`` of ``logger.info(message)`` called in ``frame``, created at ``created``."""
    record = logger.makeRecord(logger.name, logging.INFO, frame.f_code.co_filename, frame.f_lineno,
                               message, (), None, frame.f_code.co_name)
    if created is not None:  # as LogRecord.__init__ derives them from its own time.time()
        record.created = created
        record.msecs = int((created - int(created)) * 1000) + 0.0
        record.relativeCreated = (created - logging._startTime) * 1000
    return record
