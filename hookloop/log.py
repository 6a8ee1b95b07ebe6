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
        file_handler = logging.FileHandler(os.path.join(work_dir, f'{timestamp}.log'), encoding='utf-8')
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


def close_logger(logger):
    for handler in list(logger.handlers):
        handler.flush()
        handler.close()
        logger.removeHandler(handler)
