"""A log event's lines reach the terminal, the ``.log`` file and the JSON log at the event, in the
order of logging, as MMCV's do (issue 36, item 4): a process that ends without Python seeing it
(``os.abort()``, ``os._exit``) keeps every line logged before it."""
import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from log_utils import Look, json_records, make_trainer

TESTS = os.path.dirname(os.path.abspath(__file__))


def event_lines(text):
    return [line.split(' - INFO - ')[1].split('\t')[0] for line in text.splitlines() if '\tlr: ' in line]


def log_file(work_dir):
    [path] = [p for p in os.listdir(work_dir) if p.endswith('.log')]
    with open(os.path.join(work_dir, path), encoding='utf-8') as f:  # another reader: what is on disk
        return f.read()


def test_every_line_is_at_its_destinations_by_the_next_iteration(tmp_path):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    seen = []

    def look(trainer):  # at the start of iteration i: the events of the i // 2 iterations before it
        seen.append((len(event_lines(terminal.getvalue())), len(event_lines(log_file(tmp_path))),
                     len(json_records(str(tmp_path), 'train'))))

    trainer.register_hook(Look(look))
    trainer.train()
    trainer.close()
    assert seen == [(i // 2,) * 3 for i in range(10)]
    assert event_lines(terminal.getvalue()) == [f'Epoch [1][{n}/10]' for n in (2, 4, 6, 8, 10)]


_CRASH = textwrap.dedent('''
    import os, sys, torch
    from hookloop import Hook, Trainer
    from conftest import Regressor, regression_data

    class Crash(Hook):
        def before_train_iter(self, trainer):
            if trainer.iter == {crash_after}:  # {crash_after} iterations done, each logged
                {how}

    torch.manual_seed(0)
    trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05),
                      train_dataloader=torch.utils.data.DataLoader(regression_data(), batch_size=4),
                      max_epochs=10, work_dir={work_dir!r}, seed=0, device='cpu',
                      log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook')]))
    trainer.register_hook(Crash())
    trainer.train()
''')


@pytest.mark.parametrize('how', ['os.abort()', 'os._exit(3)', 'os.kill(os.getpid(), 9)'])
def test_a_process_ended_without_python_seeing_it_keeps_every_line(tmp_path, how):
    """Killed as iteration N + 1 starts: the terminal (a file here), the ``.log``
    and the ``.log.json`` hold all N lines (the lines used to wait up to a second: 25-35 lost)."""
    crash_after = 37
    work_dir = tmp_path / 'run'
    script = _CRASH.format(crash_after=crash_after, how=how, work_dir=str(work_dir))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get('PYTHONPATH', '')]))
    with open(tmp_path / 'terminal', 'wb') as terminal:
        result = subprocess.run([sys.executable, '-c', script], stdout=terminal, stderr=subprocess.PIPE,
                                env=env, timeout=300)
    assert result.returncode in (-signal.SIGABRT, 3, -signal.SIGKILL), result.stderr.decode()[-2000:]
    expected = [f'Epoch [{n // 10 + 1}][{n % 10 + 1}/10]' for n in range(crash_after)]
    assert event_lines(log_file(work_dir)) == expected
    assert event_lines((tmp_path / 'terminal').read_text(encoding='utf-8')) == expected
    assert [r['iter'] for r in json_records(str(work_dir), 'train')] == list(range(1, crash_after + 1))


def test_another_record_comes_after_the_lines_logged_before_it(tmp_path):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    trainer.register_hook(Look(lambda t: t.logger.info('note %d', t.iter) if t.iter in (3, 7) else None))
    trainer.train()
    trainer.close()
    for text in (terminal.getvalue(), log_file(tmp_path)):
        messages = [line.split(' - INFO - ', 1)[1] for line in text.splitlines() if ' - INFO - ' in line]
        ordered = [m.split('\t')[0] for m in messages if m.startswith(('note', 'Epoch ['))]
        assert ordered == ['Epoch [1][2/10]', 'note 3', 'Epoch [1][4/10]', 'Epoch [1][6/10]', 'note 7',
                           'Epoch [1][8/10]', 'Epoch [1][10/10]']


def test_two_text_loggers_and_a_child_logger_keep_the_order_of_logging(tmp_path):
    hooks = [dict(type='TextLoggerHook', interval=2), dict(type='TextLoggerHook', interval=3, by_epoch=False)]
    trainer = make_trainer(str(tmp_path), hooks, interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    child = logging.getLogger(trainer.logger.name + '.child')  # propagates to the run's handlers only
    trainer.register_hook(Look(lambda t: child.info('note %d', t.iter) if t.iter == 5 else None))
    trainer.train()
    trainer.close()
    for text in (terminal.getvalue(), log_file(tmp_path)):
        kept = [line.split(' - INFO - ')[1].split('\t')[0] for line in text.splitlines()
                if '\tlr: ' in line or 'note' in line]
        assert kept == ['Epoch [1][2/10]', 'Iter [3/10]', 'Epoch [1][4/10]', 'note 5', 'Epoch [1][6/10]',
                        'Iter [6/10]', 'Epoch [1][8/10]', 'Iter [9/10]', 'Epoch [1][10/10]']


def test_a_users_handler_gets_each_record_at_its_event_with_the_lines_time(tmp_path):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=1)
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    received = []

    class User(logging.Handler):
        def emit(self, record):
            received.append((record.created, record.getMessage()))

    trainer.logger.addHandler(User())
    counts = []
    trainer.register_hook(Look(lambda t: counts.append((len(event_lines('\n'.join(
        f'x - INFO - {m}' for _, m in received))), len(event_lines(terminal.getvalue()))))))
    trainer.train()
    trainer.close()
    assert counts == [(i // 2, i // 2) for i in range(10)]
    stamps = [line.split(' - ')[0] for line in terminal.getvalue().splitlines() if '\tlr: ' in line]
    formatter = logging.Formatter()
    assert stamps == [formatter.formatTime(logging.makeLogRecord({'created': c, 'msecs': (c % 1) * 1000}))
                      for c, m in received if '\tlr: ' in m]


class Opaque:
    """A metric no JSON encoder can write (``float()`` refuses it)."""

    def __repr__(self):
        return 'opaque'


def test_a_record_that_cannot_be_written_fails_the_run_at_its_event(tmp_path):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=2, val=True,
                           evaluation=dict(interval=1),
                           val_evaluator=lambda loss, batch: {'mse': loss, 'odd': Opaque()})
    trainer.logger.handlers[0].setStream(io.StringIO())
    with pytest.raises(TypeError, match='Opaque'):
        trainer.train()
    trainer.close()
    assert trainer.iter == 10  # the first validation, at the first epoch's end
    with open(next(tmp_path.glob('*.log.json')), encoding='utf-8') as f:
        records = [json.loads(line) for line in f]
    assert records[0]['hookloop'] and [r['iter'] for r in records[1:]] == [2, 4, 6, 8, 10]
