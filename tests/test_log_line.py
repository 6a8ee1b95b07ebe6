"""``info_line``: a log event's line written as ``logger.info`` would write it (issue 26)."""
import io
import logging

from hookloop.logging.logger import close_logger, create_logger, info_line, start_log_file


def make(tmp_path, level='INFO'):
    logger = create_logger(str(tmp_path), 'stamp', level=level)
    stream = io.StringIO()
    logger.handlers[0].setStream(stream)
    start_log_file(logger)
    return logger, stream


def lines(logger, stream, tmp_path):
    for handler in logger.handlers:
        handler.flush()
    with open(tmp_path / 'stamp.log', encoding='utf-8') as f:
        return stream.getvalue(), f.read()


def test_the_line_is_the_standard_one_on_every_handler(tmp_path):
    logger, stream = make(tmp_path)
    seen = []

    class User(logging.Handler):
        def emit(self, record):
            seen.append((record.created, record.getMessage(), self.format(record)))

    user = User()
    user.setFormatter(logging.Formatter('%(asctime)s|%(levelname)s|%(message)s'))
    logger.addHandler(user)
    info_line(logger, 'Epoch [1][10/50]\tlr: 1.000e-02')
    logger.info('Epoch [1][10/50]\tlr: 1.000e-02')  # the standard path, for comparison
    terminal, file = lines(logger, stream, tmp_path)
    close_logger(logger)
    assert terminal == file
    fast, slow = terminal.splitlines()
    assert fast.split(' - ', 1)[1] == slow.split(' - ', 1)[1] == 'hookloop - INFO - Epoch [1][10/50]\tlr: 1.000e-02'
    assert len(fast.split(' - ')[0]) == len('2026-01-01 00:00:00,000')
    # the user's handler got a record, with the creation time the line shows
    (created, message, formatted), _ = seen
    assert message == 'Epoch [1][10/50]\tlr: 1.000e-02'
    assert formatted.split('|')[0] == fast.split(' - ')[0]


def test_a_changed_formatter_or_level_takes_the_standard_path(tmp_path):
    logger, stream = make(tmp_path)
    logger.handlers[0].setFormatter(logging.Formatter('[%(levelname)s] %(message)s'))
    info_line(logger, 'event')
    terminal, file = lines(logger, stream, tmp_path)
    assert terminal == '[INFO] event\n' and file.endswith(' - hookloop - INFO - event\n')
    logger.setLevel(logging.WARNING)
    info_line(logger, 'hidden')
    terminal, file = lines(logger, stream, tmp_path)
    close_logger(logger)
    assert 'hidden' not in terminal + file


def test_records_before_the_log_file_starts_are_kept(tmp_path):
    logger = create_logger(str(tmp_path), 'early')
    logger.handlers[0].setStream(io.StringIO())
    info_line(logger, 'before the run')  # the file handler keeps a record until it starts
    start_log_file(logger)
    close_logger(logger)
    with open(tmp_path / 'early.log', encoding='utf-8') as f:
        assert f.read().endswith(' - hookloop - INFO - before the run\n')
