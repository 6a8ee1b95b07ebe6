"""The log events' lines written in batches (``hookloop.logging.line_batch``, issue 26): they wait
for a flush, come out in the order they were logged, a user's handler still gets each record at
its event, and a line that cannot be written fails the run."""
import io
import json
import logging

import pytest

from hookloop.logging import flusher
from hookloop.logging.logger import deferrable
from log_utils import Look, json_records, make_trainer


def event_lines(text):
    return [line for line in text.splitlines() if '\tlr: ' in line]


@pytest.fixture
def no_timer(monkeypatch, flush_every):
    """The flusher's own timer out of the way: only the flush points write."""
    flush_every(3600.0)


def test_lines_wait_for_a_flush_and_come_out_whole(tmp_path, no_timer):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    seen = {}

    def look(trainer):
        if trainer.iter == 4:  # after the events of iterations 2 and 4
            seen['before'] = len(event_lines(terminal.getvalue()))
            assert deferrable(trainer.logger) is not None
            flusher.flush_logs()
            seen['after'] = len(event_lines(terminal.getvalue()))

    trainer.register_hook(Look(look))
    trainer.train()
    trainer.close()
    assert seen == {'before': 0, 'after': 2}
    lines = event_lines(terminal.getvalue())
    assert [line.split(' - INFO - ')[1].split('\t')[0] for line in lines] == \
        [f'Epoch [1][{n}/10]' for n in (2, 4, 6, 8, 10)]
    with open(next(tmp_path.glob('*.log')), encoding='utf-8') as f:
        assert event_lines(f.read()) == lines  # the .log file: the same lines, the same times
    assert [r['iter'] for r in json_records(str(tmp_path), 'train')] == [2, 4, 6, 8, 10]


def test_another_record_comes_after_the_lines_logged_before_it(tmp_path, no_timer):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    trainer.register_hook(Look(lambda t: t.logger.info('note %d', t.iter) if t.iter in (3, 7) else None))
    trainer.train()
    trainer.close()
    messages = [line.split(' - INFO - ', 1)[1] for line in terminal.getvalue().splitlines() if ' - INFO - ' in line]
    ordered = [m.split('\t')[0] for m in messages if m.startswith(('note', 'Epoch ['))]
    assert ordered == ['Epoch [1][2/10]', 'note 3', 'Epoch [1][4/10]', 'Epoch [1][6/10]', 'note 7',
                       'Epoch [1][8/10]', 'Epoch [1][10/10]']


def test_a_users_handler_gets_each_record_at_its_event(tmp_path, no_timer):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    received = []

    class User(logging.Handler):
        def emit(self, record):
            received.append((record.created, record.getMessage()))

    trainer.logger.addHandler(User())
    counts = []
    trainer.register_hook(Look(lambda t: counts.append((len(event_lines('\n'.join(m for _, m in received))),
                                                        len(event_lines(terminal.getvalue()))))))
    trainer.train()
    trainer.close()
    # at the start of iteration i, the events of the i // 2 iterations before it reached both
    assert counts == [(i // 2, i // 2) for i in range(10)]
    # the terminal's line shows the time the user's record was created at
    stamps = [line.split(' - ')[0] for line in event_lines(terminal.getvalue())]
    formatter = logging.Formatter()
    assert stamps == [formatter.formatTime(logging.makeLogRecord({'created': c, 'msecs': (c % 1) * 1000}))
                      for c, m in received if '\tlr: ' in m]


class Opaque:
    """A metric no JSON encoder can write (``float()`` refuses it)."""

    def __repr__(self):
        return 'opaque'


@pytest.mark.parametrize('timer', [3600.0, 0.001])  # written at a flush point, or by the flusher's thread
def test_a_record_that_cannot_be_written_fails_the_run(tmp_path, monkeypatch, timer, flush_every):
    flush_every(timer)
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=2, val=True,
                           evaluation=dict(interval=1),
                           val_evaluator=lambda loss, batch: {'mse': loss, 'odd': Opaque()})
    trainer.logger.handlers[0].setStream(io.StringIO())
    with pytest.raises(TypeError, match='Opaque'):
        trainer.train()
    trainer.close()
    # the JSON log is closed and holds each record that could be written, whole
    with open(next(tmp_path.glob('*.log.json')), encoding='utf-8') as f:
        records = [json.loads(line) for line in f]
    assert records[0]['hookloop'] and all(r['mode'] == 'train' for r in records[1:])
    assert not [t for t in flusher._files if str(getattr(t, 'name', '')).startswith(str(tmp_path))]


def epoch_lines(text):
    return [line.split(' - INFO - ')[1].split('\t')[0] for line in text.splitlines() if '\tlr: ' in line]


def test_two_text_loggers_on_one_logger_keep_the_order_of_logging(tmp_path, no_timer):
    hooks = [dict(type='TextLoggerHook', interval=2), dict(type='TextLoggerHook', interval=3, by_epoch=False)]
    trainer = make_trainer(str(tmp_path), hooks, interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    trainer.train()
    trainer.close()
    assert epoch_lines(terminal.getvalue()) == [
        'Epoch [1][2/10]', 'Iter [3/10]', 'Epoch [1][4/10]', 'Epoch [1][6/10]', 'Iter [6/10]', 'Epoch [1][8/10]',
        'Iter [9/10]', 'Epoch [1][10/10]']


def test_a_child_loggers_record_comes_after_the_lines_before_it(tmp_path, no_timer):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    child = logging.getLogger(trainer.logger.name + '.child')  # propagates to the run's handlers only
    trainer.register_hook(Look(lambda t: child.info('note %d', t.iter) if t.iter == 5 else None))
    trainer.train()
    trainer.close()
    expected = ['Epoch [1][2/10]', 'Epoch [1][4/10]', 'note 5', 'Epoch [1][6/10]']
    for text in (terminal.getvalue(), next(tmp_path.glob('*.log')).read_text(encoding='utf-8')):
        kept = [line.split(' - INFO - ')[1].split('\t')[0] for line in text.splitlines()
                if '\tlr: ' in line or 'note' in line]
        assert kept[:4] == expected


def test_a_line_goes_to_the_handlers_and_level_of_its_event(tmp_path, no_timer):
    received = []

    class User(logging.Handler):
        def emit(self, record):
            received.append(record.getMessage().split('\t')[0])

    def look(trainer):
        if trainer.iter == 5:
            trainer.logger.addHandler(User())  # after the events of iterations 2 and 4
        if trainer.iter == 7:
            trainer.logger.setLevel(logging.WARNING)  # after the event of 6 (written at once: a user's handler)

    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    trainer.register_hook(Look(look))
    trainer.train()
    trainer.close()
    assert epoch_lines(terminal.getvalue()) == ['Epoch [1][2/10]', 'Epoch [1][4/10]', 'Epoch [1][6/10]']
    assert [m for m in received if m.startswith('Epoch [')] == ['Epoch [1][6/10]']


def test_the_flusher_survives_a_target_that_fails(monkeypatch, flush_every):
    import threading
    flush_every(0.001)
    flushed = threading.Event()

    class Broken:
        def flush(self):
            raise RuntimeError('a bug in a flush')

    class Fine:
        calls = 0

        def flush(self):
            self.calls += 1
            if self.calls > 3:  # the thread flushed it again after the broken one failed, several times
                flushed.set()

    broken, fine = Broken(), Fine()
    flusher.register(broken)
    flusher.register(fine)
    try:
        assert flushed.wait(60)
    finally:
        flusher.unregister(broken)
        flusher.unregister(fine)


def test_a_forked_child_logs_through_the_runs_logger_while_lines_wait(tmp_path, monkeypatch, flush_every):
    import os
    flush_every(0.0005)  # the thread is flushing whenever it can
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=1, max_epochs=1)
    trainer.logger.handlers[0].setStream(io.StringIO())
    children = []

    def look(trainer):
        for _ in range(3):
            pid = os.fork()
            if pid == 0:  # a child whose parent's flusher may have been inside a batch
                trainer.logger.info('from a child')
                os._exit(0)
            children.append(pid)

    trainer.register_hook(Look(look))
    trainer.train()
    trainer.close()
    for pid in children:
        for _ in range(600):  # a child that hangs on a lock its parent's thread held never exits
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            import time
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail('a forked child hung')
        assert os.waitstatus_to_exitcode(status) == 0


def test_a_record_tensorboard_cannot_write_fails_its_next_call_and_the_flusher_lives_on(monkeypatch, flush_every):
    pytest.importorskip('tensorboard')
    from tensorboard.compat.proto.summary_pb2 import Summary

    from hookloop.hooks.loggers.tensorboard import TensorboardLoggerHook
    flush_every(0.001)
    written = []

    class Writer:  # TensorBoard's writer, as the hook uses it
        def _get_file_writer(self):
            return self

        def add_summary(self, summary, step):
            written.append(step)

    hook = TensorboardLoggerHook()
    hook._summary, hook.writer = Summary, Writer()
    hook._batch.start()
    try:
        hook.log(None, {'mode': 'train', 'iter': 1, 'count': 10 ** 400})  # an int no float can hold
        while hook._kept_failure is None:  # the flusher's thread tries it (no time asserted)
            flusher._stop.wait(0.01)
        with pytest.raises(OverflowError):
            hook.log(None, {'mode': 'train', 'iter': 2, 'loss': 0.5})
        hook.log(None, {'mode': 'train', 'iter': 3, 'loss': 0.25})
        while not written:
            flusher._stop.wait(0.01)
        assert written == [3] and flusher._thread.is_alive()
    finally:
        hook._batch.stop()
