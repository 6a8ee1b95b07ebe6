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
    earlier = line_batch(logger)
    if earlier is not None:
        earlier.flush()  # an earlier trainer's lines, to its handlers
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    batch = logger.hookloop_lines = LineBatch()  # the log events' lines wait here (see line_batch)
    logger.setLevel(level if rank == 0 else logging.WARNING)
    formatter = logging.Formatter(_FORMAT)
    formatter.hookloop_line = True  # lines for this formatter may be written by :func:`info_line`
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(formatter)
    stream.addFilter(batch)
    logger.addHandler(stream)
    if rank == 0 and work_dir is not None:
        file_handler = DeferredFileHandler(os.path.join(work_dir, f'{timestamp}.log'))
        file_handler.setFormatter(formatter)
        file_handler.addFilter(batch)
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
    if line_batch(logger) is not None:
        line_batch(logger).flush()
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
    if handler.filters and _foreign(handler.filters):
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
    """The :class:`~hookloop.logging.line_batch.LineBatch` :func:`create_logger` gave ``logger``
    (a filter of each of its handlers), or None."""
    return getattr(logger, 'hookloop_lines', None)


def deferrable(logger):
    """The handlers a log event's line goes to, as ``(handler, stream handler)`` pairs, when the
    line may wait in the logger's :class:`~hookloop.logging.line_batch.LineBatch`: every handler
    of ``logger`` is one of :func:`create_logger`'s own, as it made them. Else None (a user's
    handler gets each record at its event)."""
    if line_batch(logger) is None or logger.filters or logger.disabled or not logger.handlers:
        return None
    handlers = []
    for handler in logger.handlers:
        direct = _direct(handler)
        if direct is None:
            return None
        if logging.INFO >= handler.level:
            handlers.append((handler, direct))
    return handlers


def _foreign(filters):
    return any(type(f) is not LineBatch for f in filters)


def _asctime(created, converter):
    second = int(created)
    cached = _seconds
    if cached[0] != second or cached[1] is not converter:
        cached[:] = second, converter, time.strftime(_TIME_FORMAT, converter(created))
    return _MSEC_FORMAT % (cached[2], int((created - second) * 1000))


def info_line(logger, message):
    """``logger.info(message)`` for a run's logger, cheaper (a log event's line).

    The handlers :func:`create_logger` made get the line they would write, formatted once for
    all of them, without a ``LogRecord``; any other handler (a user's) gets the record as
    usual, with the same creation time. A logger or handler changed in a way this does not
    reproduce (filters, another formatter or level) takes the standard path."""
    if not logger.isEnabledFor(logging.INFO):
        return
    if logger.filters or logger.disabled or not logger.handlers:
        logger.info(message, stacklevel=2)
        return
    handlers, record = [], None
    for handler in logger.handlers:
        if logging.INFO >= handler.level:
            direct = _direct(handler)
            handlers.append((handler, direct))
            if direct is None and record is None:
                frame = sys._getframe(1)
                record = logger.makeRecord(logger.name, logging.INFO, frame.f_code.co_filename, frame.f_lineno,
                                           message, (), None, frame.f_code.co_name)
    write_line(logger, handlers, message, time.time() if record is None else record.created, record)


def write_line(logger, handlers, message, created, record=None):
    """Write the line of ``logger.info(message)`` made at ``created`` to ``handlers``, the
    ``(handler, stream handler)`` pairs of :func:`deferrable` (a handler whose pair is None gets
    ``record``): the log event's line, now or from its batch."""
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
        except Exception:  # as logging.StreamHandler.emit does (also: a handler closed since the event)
            if record is None:
                record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, message, (), None, 'info_line')
            handler.handleError(record)
