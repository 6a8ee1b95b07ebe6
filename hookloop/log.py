"""The run's Python logger: terminal plus ``<work_dir>/<timestamp>.log`` on rank 0."""
import logging
import os
import sys

_FORMAT = '%(asctime)s - hookloop - %(levelname)s - %(message)s'


def create_logger(work_dir, timestamp, rank=0, level='INFO'):
    """A fresh logger for one trainer. Other ranks print warnings and errors only."""
    logger = logging.getLogger(f'hookloop.{timestamp}.{id(work_dir)}')
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(level if rank == 0 else logging.WARNING)
    formatter = logging.Formatter(_FORMAT)
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
    run that finds nothing to do, leaves no empty ``.log`` behind."""

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
            self._file.close()
        self._pending = []
        super().close()


def start_log_file(logger):
    """Create the log file of ``logger`` (rank 0) and write what was logged so far."""
    for handler in logger.handlers:
        if isinstance(handler, DeferredFileHandler):
            handler.start()


def close_logger(logger):
    for handler in list(logger.handlers):
        handler.flush()
        handler.close()
        logger.removeHandler(handler)
