import os
import re
import types

import pytest
import torch

from hookloop.errors import ConfigError
from hookloop.hooks import TextLoggerHook
from log_utils import json_records, make_trainer, plain_losses, run


def test_json_losses_are_interval_means_of_the_plain_loop(tmp_path):
    run(make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5))
    records = json_records(tmp_path, 'train')
    losses = plain_losses()
    assert [r['iter'] for r in records] == [5, 10, 15, 20]  # step = iterations completed
    assert [(r['epoch'], r['inner_iter']) for r in records] == [(1, 5), (1, 10), (2, 5), (2, 10)]
    for r in records:
        expected = losses[r['iter'] - 5:r['iter']].mean().item()
        assert r['loss'] == pytest.approx(expected, rel=1e-6)
        assert r['lr'] == 0.05 and r['momentum'] == 0.9
        assert r['time'] > 0 and r['data_time'] >= 0


def test_terminal_line_keeps_mmcv_shape(tmp_path):
    run(make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5))
    text = open(next(p for p in tmp_path.iterdir() if p.name.endswith('.log'))).read()
    lines = re.findall(r'Epoch \[\d+\]\[\d+/\d+\]\t.*', text)
    assert len(lines) == 4
    assert re.fullmatch(r'Epoch \[1\]\[5/10\]\tlr: 5\.000e-02, eta: \d+:\d\d:\d\d, time: \d+\.\d{3}, '
                        r'data_time: \d+\.\d{3}, momentum: 0\.9000, loss: \d+\.\d{4}', lines[0]), lines[0]


def test_global_iteration_form_and_partial_last_interval(tmp_path):
    hooks = [dict(type='TextLoggerHook', by_epoch=False, ignore_last=False)]
    run(make_trainer(tmp_path, hooks, interval=4))
    records = json_records(tmp_path, 'train')
    # every 4 iterations, plus the ends of the two epochs (10 and 20)
    assert [r['iter'] for r in records] == [4, 8, 10, 12, 16, 20]
    losses = plain_losses()
    assert records[2]['loss'] == pytest.approx(losses[8:10].mean().item(), rel=1e-6)  # only 9 and 10
    assert 'inner_iter' not in records[0]
    text = open(next(p for p in tmp_path.iterdir() if p.name.endswith('.log'))).read()
    assert 'Iter [4/20]\tlr: ' in text


def test_validation_logged_with_training_step(tmp_path):
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5, val=True,
                           evaluation=dict(interval=5, by_epoch=False))
    run(trainer)
    vals = json_records(tmp_path, 'val')
    assert [(r['epoch'], r['iter']) for r in vals] == [(1, 5), (1, 10), (2, 15), (2, 20)]
    assert vals[-1]['mse'] == pytest.approx(trainer.metrics['mse'])
    text = open(next(p for p in tmp_path.iterdir() if p.name.endswith('.log'))).read()
    assert re.search(r'Epoch\(val\) \[2\]  mse: \d+\.\d{4}', text)


def test_eta_is_mean_logged_iteration_time_times_iterations_left():
    hook = TextLoggerHook(interval=5)
    hook._start_iter = hook._last_iter = 0
    trainer = types.SimpleNamespace(max_iters=25)
    assert hook.eta_seconds(trainer, {'iter': 5, 'time': 0.5}) == pytest.approx(0.5 * 20)
    hook._last_iter = 5
    # (5 x 0.5 + 5 x 1.5) / 10 = 1.0 s per iteration, 15 left
    assert hook.eta_seconds(trainer, {'iter': 10, 'time': 1.5}) == pytest.approx(15.0)


def test_out_dir_copies_logs_and_exp_name_is_logged(tmp_path):
    work_dir, out_dir = tmp_path / 'exp1', tmp_path / 'shared'
    run(make_trainer(work_dir, [dict(type='TextLoggerHook', out_dir=str(out_dir), interval_exp_name=10)]))
    copied = sorted(os.listdir(out_dir / 'exp1'))
    assert [n for n in copied if n.endswith('.log.json')] and [n for n in copied if n.endswith('.log')]
    json_name = next(n for n in copied if n.endswith('.log.json'))
    assert (out_dir / 'exp1' / json_name).read_text() == (work_dir / json_name).read_text()
    log_text = (out_dir / 'exp1' / next(n for n in copied if n.endswith('.log'))).read_text()
    assert log_text.count('Exp name: exp1') == 2  # at iterations 10 and 20


def test_two_runs_share_an_out_dir_each_in_its_own_subdirectory(tmp_path):
    """The hook declares where it writes (``<out_dir>/<work dir name>``), not the shared
    ``out_dir``: two runs, even at once, do not lock each other out of it."""
    out_dir = tmp_path / 'shared'
    first = make_trainer(tmp_path / 'exp1', [dict(type='TextLoggerHook', out_dir=str(out_dir))])
    second = make_trainer(tmp_path / 'exp2', [dict(type='TextLoggerHook', out_dir=str(out_dir))])
    hook = next(h for h in first.hooks if type(h).__name__ == 'TextLoggerHook')
    assert hook.output_dirs(first) == {'log': str(out_dir / 'exp1')}
    try:
        first.train()
        run(second)  # while the first trainer still holds its work dir and its declared directory
    finally:
        first.close()
    assert sorted(os.listdir(out_dir)) == ['exp1', 'exp2']


def test_unwritable_out_dir_fails_before_training(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    trainer = make_trainer(tmp_path / 'w', [dict(type='TextLoggerHook', out_dir=str(blocker / 'sub'))])
    before = [p.clone() for p in trainer.model.parameters()]
    with pytest.raises(ConfigError, match='TextLoggerHook: log directory .* is not writable'):
        run(trainer)
    assert trainer.iter == 0 and all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


@pytest.mark.parametrize('interval', [0, -1, 2.5, True])
def test_bad_interval_is_refused(tmp_path, interval):
    with pytest.raises(ConfigError, match=f'TextLoggerHook interval must be a positive int, got {interval!r}'):
        make_trainer(tmp_path, [dict(type='TextLoggerHook', interval=interval)])


def test_unknown_logger_type_names_the_closest(tmp_path):
    with pytest.raises(ConfigError, match="'TensorBoardLoggerHook' is not registered .*TensorboardLoggerHook"):
        make_trainer(tmp_path, [dict(type='TensorBoardLoggerHook')])


def test_resumed_run_continues_steps_and_interval_means(tmp_path):
    first = make_trainer(tmp_path / 'a', [dict(type='TextLoggerHook', by_epoch=False)], interval=5,
                         max_epochs=2, checkpoint_config=dict(interval=6, by_epoch=False))
    first.max_iters = 12  # stop after the checkpoint at 6 and one more log at 10
    run(first)
    resumed = make_trainer(tmp_path / 'b', [dict(type='TextLoggerHook', by_epoch=False)], interval=5,
                           max_epochs=2, resume_from=str(tmp_path / 'a' / 'iter_6.pth'))
    run(resumed)
    records = json_records(tmp_path / 'b', 'train')
    losses = plain_losses()
    assert [r['iter'] for r in records] == [10, 15, 20]
    # the first window after resuming holds only the iterations this process ran (7..10)
    assert records[0]['loss'] == pytest.approx(losses[6:10].mean().item(), rel=1e-6)
    assert records[1]['loss'] == pytest.approx(losses[10:15].mean().item(), rel=1e-6)


def test_each_json_record_is_on_disk_at_the_epoch_end(tmp_path):
    """The JSON log stays open through the run (one buffered write per record); before the
    epoch-end hooks the files are flushed, so a reader there sees every record logged so far
    (mid-epoch, the flusher writes them within a second: tests/test_log_flusher.py)."""
    from hookloop import Hook
    seen = []

    class ReadLog(Hook):
        def after_train_epoch(self, trainer):
            seen.append([r['iter'] for r in json_records(tmp_path, 'train')])

    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5)
    trainer.register_hook(ReadLog())
    run(trainer)
    assert seen == [[5, 10], [5, 10, 15, 20]]


def test_below_info_no_line_is_formatted_but_json_and_eta_go_on(tmp_path, monkeypatch):
    monkeypatch.setattr(TextLoggerHook, '_format_train', lambda *a: pytest.fail('a line nobody would see'))
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5, log_level='WARNING')
    run(trainer)
    hook = next(h for h in trainer.hooks if isinstance(h, TextLoggerHook))
    records = json_records(tmp_path, 'train')
    assert [r['iter'] for r in records] == [5, 10, 15, 20]
    # the ETA's sum of logged times is kept, so a later INFO line's ETA is right
    assert hook._time_sum == pytest.approx(sum(r['time'] * 5 for r in records))
    text = open(next(p for p in tmp_path.iterdir() if p.name.endswith('.log'))).read()
    assert 'Epoch [' not in text
