"""The run's Python logger: terminal plus ``<work_dir>/<timestamp>.log`` on rank 0.

Every line reaches its destination at its event, in the order of logging, as ``logging``'s own
handlers write it: the terminal's stream and the ``.log`` file are flushed after each line, so a
process that ends without Python seeing it (``os.abort()``, a crash in an extension, ``os._exit``,
``SIGKILL``) keeps every line logged before it.

A destination that cannot be written (a full disk, a file made read-only, a closed terminal)
is reported with one line on ``stderr`` and left out from then on: training goes on (see
docs/logging.md, "When a log cannot be written").
"""
import itertools
import logging
import os
import sys
import time

_FORMAT = '%(asctime)s - hookloop - %(levelname)s - %(message)s'
_runs = itertools.count(1)  # a distinct logger for each trainer, also two made in the same second


def create_logger(work_dir, timestamp, rank=0, level='INFO'):
    """A fresh logger for one trainer. Other ranks print warnings and errors only.
    :func:`close_logger` closes its handlers and takes it out of ``logging``'s registry."""
    logger = logging.getLogger(f'hookloop.{timestamp}-{next(_runs)}')  # (no '.' in it: no per-run placeholder)
    logger.propagate = False
    logger.setLevel(level if rank == 0 else logging.WARNING)
    formatter = logging.Formatter(_FORMAT)
    formatter.hookloop_line = True  # lines for this formatter may be written by :func:`info_line`
    stream = TerminalHandler(sys.stdout)
    stream.setFormatter(formatter)
    logger.addHandler(stream)
    if rank == 0 and work_dir is not None:
        file_handler = DeferredFileHandler(os.path.join(work_dir, f'{timestamp}.log'))
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


def report_write_failure(destination, exc):
    """The one line a log destination that cannot be written gets (on ``stderr``)."""
    try:
        sys.stderr.write(f'hookloop: cannot write {destination} ({exc}); training goes on without it\n')
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr left either: nothing more to say it with
        pass


class _OneLineFailure:
    """A handler of :func:`create_logger`'s: a write that fails with an ``OSError`` turns the
    handler off with one line (:func:`report_write_failure`), not a traceback per record."""

    failure = None  # the OSError that turned the handler off

    def handle(self, record):
        if self.failure is not None:
            return False
        return super().handle(record)

    def handleError(self, record):  # noqa: N802 (logging's name)
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)  # a bug (a bad format string...): logging's traceback
        elif self.failure is None:
            self.failure = exc
            report_write_failure(self.destination(), exc)

    def destination(self):
        raise NotImplementedError


class TerminalHandler(_OneLineFailure, logging.StreamHandler):
    """The run's terminal (``stdout``)."""

    def destination(self):
        return f'the terminal ({getattr(self.stream, "name", "stdout")})'


class DeferredFileHandler(_OneLineFailure, logging.FileHandler):
    """The run's ``.log`` file, created only when the run starts (:func:`start_log_file`).

    Records before that are kept and written first, so a trainer whose build fails, or a
    run that finds nothing to do, leaves no empty ``.log`` behind. Each record is written and
    flushed at once (as ``logging.FileHandler`` does)."""

    def __init__(self, path):
        super().__init__(path, encoding='utf-8', delay=True)
        self._pending = []

    def start(self):
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                self.stream = self._open()
            except OSError as exc:  # (the work dir was checked writable: a full disk)
                self.failure = exc
                report_write_failure(self.destination(), exc)
            for record in pending:
                self.handle(record)

    def emit(self, record):
        if self._pending is not None:
            self._pending.append(record)
        elif self.stream is not None:  # (None: closed)
            super().emit(record)

    def close(self):
        try:
            super().close()  # (flushes: a full disk may refuse what a failed write left in the buffer)
        except OSError as exc:
            if self.failure is None:
                self.failure = exc
                report_write_failure(self.destination(), exc)
        self._pending = None

    def destination(self):
        return f'the log file {self.baseFilename}'


def start_log_file(logger):
    """Create the log file of ``logger`` (rank 0) and write what was logged so far."""
    for handler in logger.handlers:
        if isinstance(handler, DeferredFileHandler):
            handler.start()


def close_logger(logger):
    """Close the handlers :func:`create_logger` gave ``logger`` and forget it: nothing of the
    run stays in ``logging``'s registry (a sweep of trainers in one process leaves no trace)."""
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)
    registry = logging.Logger.manager.loggerDict
    if registry.get(logger.name) is logger:
        registry.pop(logger.name, None)


# -- the log events' fast path ------------------------------------------------------------
_TIME_FORMAT = logging.Formatter.default_time_format
_MSEC_FORMAT = logging.Formatter.default_msec_format
_OWN = (TerminalHandler, DeferredFileHandler)
_seconds = [None, None, None]  # (whole second, converter, its strftime): one strftime per second


def _direct(handler):
    """True when ``handler`` is one of :func:`create_logger`'s own, as it made it, ready to
    take a line written to its stream as it would write it itself (else: a user's handler, one
    changed since, a ``.log`` not started yet or a destination turned off, which take the record)."""
    if type(handler) not in _OWN or handler.filters or handler.stream is None or handler.failure is not None \
            or handler.terminator != '\n' or getattr(handler, '_pending', None) is not None:  # (a .log not started)
        return False
    formatter = handler.formatter  # still the one create_logger made, as it made it
    return type(formatter) is logging.Formatter and getattr(formatter, 'hookloop_line', False) \
        and formatter._fmt == _FORMAT and formatter.datefmt is None \
        and formatter.default_time_format == _TIME_FORMAT and formatter.default_msec_format == _MSEC_FORMAT


def _asctime(created, converter):
    second = int(created)
    cached = _seconds
    if cached[0] != second or cached[1] is not converter:
        cached[:] = second, converter, time.strftime(_TIME_FORMAT, converter(created))
    return _MSEC_FORMAT % (cached[2], int((created - second) * 1000))


def info_line(logger, message, *args):
    """``logger.info(message)`` for a run's logger, cheaper (a log event's line), written and
    flushed now. With ``args``, ``message`` is a function that makes the message from them, called
    only when the logger shows INFO lines (below INFO no line is formatted at all).

    The handlers :func:`create_logger` made get the line they would write, formatted once for
    all of them, without a ``LogRecord``; any other handler (a user's) gets the record as
    usual, with the same creation time. A logger or handler changed in a way this does not
    reproduce (filters, another formatter or level) takes the standard path."""
    if not logger.isEnabledFor(logging.INFO):
        return
    if args:
        message = message(*args)
    if logger.filters or logger.disabled or not logger.handlers:
        logger.info(message, stacklevel=2)
        return
    handlers, record = [], None
    for handler in logger.handlers:
        if logging.INFO >= handler.level:
            direct = _direct(handler)
            handlers.append((handler, direct))
            if not direct and record is None:
                frame = sys._getframe(1)
                record = logger.makeRecord(logger.name, logging.INFO, frame.f_code.co_filename, frame.f_lineno,
                                           message, (), None, frame.f_code.co_name)
    created = time.time() if record is None else record.created
    line = converter = None
    for handler, direct in handlers:
        if not direct:
            handler.handle(record)
            continue
        if handler.formatter.converter is not converter:
            converter = handler.formatter.converter
            line = f'{_asctime(created, converter)} - hookloop - {logging.getLevelName(logging.INFO)} - {message}\n'
        try:
            with handler.lock:
                stream = handler.stream
                stream.write(line)
                stream.flush()
        except RecursionError:
            raise
        except Exception:  # as logging.StreamHandler.emit does (an OSError turns the destination off)
            if record is None:
                record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, message, (), None, 'info_line')
            handler.handleError(record)
