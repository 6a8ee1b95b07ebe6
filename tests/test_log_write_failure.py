"""A log destination that cannot be written (a full disk, a read-only file, a closed terminal) is
one line on stderr and is left out; training goes on with the others (issue 36, item 5)."""
import errno
import io
import os

import pytest

from log_utils import Look, json_records, make_trainer

FULL = '/dev/full'  # every write to it fails with ENOSPC, as on a full disk


class FullDisk(io.TextIOBase):
    """A text stream whose writes fail as a full disk's do."""

    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _break(destination):
    """At the start of iteration 3, make ``destination`` unwritable."""
    def look(trainer):
        if trainer.iter != 3:
            return
        terminal, log_file = trainer.logger.handlers
        if destination == 'terminal':
            terminal.setStream(FullDisk())
        elif destination == 'log':
            log_file.stream.close()
            log_file.stream = open(FULL, 'a', encoding='utf-8')
        else:
            hook = next(h for h in trainer.hooks if type(h).__name__ == 'TextLoggerHook')
            hook._json_file.close()
            hook._json_file = open(FULL, 'ab')
    return Look(look)


def _event_lines(text):
    return [line for line in text.splitlines() if '\tlr: ' in line]


@pytest.mark.skipif(not os.path.exists(FULL), reason='needs /dev/full')
@pytest.mark.parametrize('destination', ['terminal', 'log', 'json'])
def test_a_destination_that_fails_is_one_line_and_training_goes_on(tmp_path, capsys, destination):
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=2, max_epochs=2,
                           checkpoint_config=dict(interval=1))
    terminal = io.StringIO()
    trainer.logger.handlers[0].setStream(terminal)
    trainer.register_hook(_break(destination))
    trainer.train()
    trainer.logger.warning('after the run')  # the standard path meets the failed destination too
    trainer.close()
    err = capsys.readouterr().err
    reports = [line for line in err.splitlines() if line.startswith('hookloop: cannot write')]
    assert len(reports) == 1 and 'No space left on device' in reports[0] and 'training goes on' in reports[0], err
    assert 'Logging error' not in err and 'Traceback' not in err
    assert trainer.iter == 20 and (tmp_path / 'epoch_2.pth').exists()  # the run and its checkpoints went on
    [log] = tmp_path.glob('*.log')
    lines = {'terminal': _event_lines(terminal.getvalue()), 'log': _event_lines(log.read_text(encoding='utf-8')),
             'json': [r['iter'] for r in json_records(str(tmp_path), 'train')]}
    kept = {'terminal': 10, 'log': 10, 'json': 10}
    kept[destination] = 1  # the event of iteration 2 (2 done); the one of 4 met the failure
    assert {key: len(value) for key, value in lines.items()} == kept
    named = {'terminal': 'the terminal', 'log': f'the log file {log}', 'json': 'the JSON log '}[destination]
    assert reports[0].startswith(f'hookloop: cannot write {named}')


def test_a_log_file_that_fails_through_the_standard_path_is_one_line(tmp_path, capsys):
    """Records that go through ``logging`` (a hook's ``logger.info``), not the event's fast path."""
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=100, max_epochs=1)
    trainer.logger.handlers[0].setStream(io.StringIO())

    def look(trainer):
        if trainer.iter == 2:
            trainer.logger.handlers[1].stream = FullDisk()
        trainer.logger.info('note %d', trainer.iter)

    trainer.register_hook(Look(look))
    trainer.train()
    trainer.close()
    err = capsys.readouterr().err
    [log] = tmp_path.glob('*.log')
    assert [line for line in err.splitlines() if line] == [
        f'hookloop: cannot write the log file {log} ([Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}); '
        'training goes on without it']
    assert trainer.iter == 10


def test_a_bug_in_a_record_still_gets_loggings_own_report(tmp_path, capsys):
    """Not an OSError (a bad format string of a hook's): logging's traceback, the handler stays."""
    trainer = make_trainer(str(tmp_path), [dict(type='TextLoggerHook')], interval=100, max_epochs=1)
    trainer.logger.handlers[0].setStream(io.StringIO())
    trainer.register_hook(Look(lambda t: trainer.logger.info('%d', 'text') if t.iter == 1 else None))
    trainer.train()
    trainer.logger.info('still written')
    trainer.close()
    assert 'Logging error' in capsys.readouterr().err
    [log] = tmp_path.glob('*.log')
    assert log.read_text(encoding='utf-8').rstrip().endswith('still written')
