import time

from hookloop import Hook
from hookloop.logging.profiling import format_timing_table, timing_rows
from log_utils import json_records, make_trainer, run


class SlowHook(Hook):
    """Sleeps in after_train_iter: the profile must put it first."""

    def after_train_iter(self, trainer):
        time.sleep(0.004)


def test_profile_table_finds_the_slow_hook_and_counts_calls(tmp_path):
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5, profile_hooks=True,
                           custom_hooks=[dict(type=SlowHook)])
    run(trainer)
    profile = [r for r in json_records(tmp_path, 'profile')]
    assert len(profile) == 1
    rows = profile[0]['hooks']
    assert (rows[0]['hook'], rows[0]['stage']) == ('SlowHook', 'after_train_iter')
    assert rows[0]['calls'] == 20 and rows[0]['total_s'] >= 20 * 0.004
    assert rows[0]['mean_us'] >= 4000
    calls = {(r['hook'], r['stage']): r['calls'] for r in rows}
    assert calls[('OptimizerHook', 'after_train_iter')] == 20
    assert calls[('TextLoggerHook', 'after_train_iter')] == 4  # scheduled: only its log iterations (5, 10, ...)
    assert ('IterTimerHook', 'before_train_iter') not in calls  # timing needs no call per iteration
    assert calls[('TextLoggerHook', 'before_run')] == 1
    assert abs(sum(r['percent'] for r in rows) - 100) < 1e-6
    text = open(next(p for p in tmp_path.iterdir() if p.name.endswith('.log'))).read()
    assert 'time spent in hooks, slowest first:' in text
    table_first_row = text.split('time spent in hooks, slowest first:\n')[1].splitlines()[1]
    assert table_first_row.split()[:3] == ['SlowHook', 'after_train_iter', '20']


def test_no_profile_without_the_flag(tmp_path):
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5)
    run(trainer)
    assert trainer.hook_timings == {} and json_records(tmp_path, 'profile') == []


def test_timing_table_is_sorted_and_totalled():
    rows = timing_rows({('A', 'after_train_iter'): [0.1, 10], ('B', 'before_run'): [0.3, 1],
                        ('C', 'after_run'): [0.0, 0]})
    assert [r['hook'] for r in rows] == ['B', 'A']  # never-called entries left out
    assert rows[0]['percent'] == 75.0 and rows[1]['mean_us'] == 10000.0
    table = format_timing_table(rows).splitlines()
    assert table[0].split() == ['hook', 'stage', 'calls', 'total', 's', 'mean', 'us', '%']
    assert table[-1].split() == ['total', '11', '0.4000']


def test_cli_profile_hooks_flag_writes_the_table(tmp_path):
    from hookloop.cli import main
    config = tmp_path / 'tiny.py'
    config.write_text(
        "custom_imports = ['hookloop.examples.digits']\n"
        "model = dict(type='DigitsMLP', hidden=16)\n"
        "train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=256)\n"
        "optimizer = dict(type='SGD', lr=0.1)\n"
        "max_iters = 6\nseed = 0\ndevice = 'cpu'\n"
        "log_config = dict(interval=3, hooks=[dict(type='TextLoggerHook', by_epoch=False)])\n")
    assert main(['train', str(config), '--work-dir', str(tmp_path / 'w'), '--profile-hooks']) == 0
    rows = json_records(tmp_path / 'w', 'profile')[0]['hooks']
    calls = {(r['hook'], r['stage']): r['calls'] for r in rows}
    assert calls[('TextLoggerHook', 'after_train_iter')] == 2  # iterations 3 and 6
    assert [r['iter'] for r in json_records(tmp_path / 'w', 'train')] == [3, 6]
