import io
import re
import sys

import pytest

from hookloop.errors import ConfigError
from hookloop.hooks import ProgressBarHook
from log_utils import make_trainer, run

pytest.importorskip('tqdm', reason='tqdm is not installed')


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def bar_of(trainer):
    return next(h for h in trainer.hooks if isinstance(h, ProgressBarHook))


def test_bar_counts_iterations_and_log_lines_stay_whole(tmp_path, capsys):
    # the bar and the log share stdout, as on a terminal
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5,
                           custom_hooks=[dict(type='ProgressBarHook', enabled=True, mininterval=0)])
    run(trainer)
    out = capsys.readouterr().out
    assert re.search(r'train: 100%\|.*\| 20/20', out)
    log_lines = [line for line in out.split('\n') if 'Epoch [' in line]
    assert len(log_lines) == 4
    for line in log_lines:  # the bar is wiped (spaces, carriage return) before each log line
        segments = line.split('\r')  # what a terminal shows is the text after the last \r
        assert re.match(r'\d{4}-\d\d-\d\d .* - hookloop - INFO - Epoch \[\d\]\[(5|10)/10\]\tlr: ', segments[-1])
        assert len(segments) == 1 or segments[-2].strip() == '', line
    assert bar_of(trainer).bar is None  # closed


def test_auto_shows_only_on_a_terminal_and_rank_0(tmp_path):
    terminal = FakeTerminal()
    trainer = make_trainer(tmp_path / 'a', [dict(type='TextLoggerHook')],
                           custom_hooks=[ProgressBarHook(file=terminal, mininterval=0)])
    run(trainer)
    assert '20/20' in terminal.getvalue()
    pipe = io.StringIO()
    trainer = make_trainer(tmp_path / 'b', [dict(type='TextLoggerHook')], custom_hooks=[ProgressBarHook(file=pipe)])
    run(trainer)
    assert pipe.getvalue() == ''
    hook = ProgressBarHook(enabled=True, file=terminal)
    trainer.rank = 1
    assert not hook._active(trainer)


def test_bar_is_closed_when_training_fails(tmp_path):
    from test_trackers import FailAt
    hook = ProgressBarHook(enabled=True, file=FakeTerminal())
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], custom_hooks=[hook, dict(type=FailAt, at=3)])
    with pytest.raises(RuntimeError, match='boom at 3'):
        run(trainer)
    assert hook.bar is None and hook._redirect is None
    assert all(h.stream in (sys.stdout, sys.stderr) or not hasattr(h, 'tqdm_class') for h in trainer.logger.handlers)


def test_bad_enabled_value_is_refused():
    with pytest.raises(ConfigError, match="ProgressBarHook enabled must be 'auto', True or False, got 'yes'"):
        ProgressBarHook(enabled='yes')
