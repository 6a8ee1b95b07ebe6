"""The trackers' waiting records (``hookloop.logging.flusher``, ``record_batch``): handed over at the
flush points, at the first event a period after the last hand-over, when the logger closes and at
every exit Python sees; no thread; a forked child never hands over its parent's records."""
import glob
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from hookloop import Hook
from hookloop.logging import flusher
from hookloop.logging.record_batch import RecordBatch
from log_utils import make_trainer, run

TESTS = os.path.dirname(os.path.abspath(__file__))


class Kept:
    """A tracker's hand-over: what it got, batch by batch."""

    def __init__(self):
        self.batches, self.failures = [], []

    def hand_over(self, records):
        self.batches.append([record['iter'] for record, _ in records])


def test_records_wait_for_a_period_then_go_together(flush_every):
    flush_every(3600.0)
    kept = Kept()
    batch = RecordBatch(kept.hand_over, kept.failures.append)
    batch.start()
    try:
        batch.add({'iter': 1})
        batch.add({'iter': 2})
        assert kept.batches == []
        flush_every(1e-9)  # the period has passed: the next event hands over all of them
        batch.add({'iter': 3})
        assert kept.batches == [[1, 2, 3]]
        flush_every(3600.0)
        batch.add({'iter': 4})
        flusher.flush_logs()  # a flush point
        assert kept.batches == [[1, 2, 3], [4]]
    finally:
        batch.stop()
    assert batch not in flusher.registered()


def test_a_failing_target_is_reported_and_the_others_are_flushed(capsys):
    class Broken:
        def flush(self):
            raise RuntimeError('a bug in a flush')

    kept = Kept()
    batch = RecordBatch(kept.hand_over, kept.failures.append)
    broken = Broken()
    flusher.register(broken)
    batch.start()
    try:
        batch.add({'iter': 1})
        flusher.flush_logs()
    finally:
        flusher.unregister(broken)
        batch.stop()
    assert kept.batches == [[1]] and 'a bug in a flush' in capsys.readouterr().err


def test_a_failing_hand_over_goes_to_the_logger(flush_every):
    flush_every(3600.0)
    failures = []

    def hand_over(records):
        raise OSError('the store is gone')

    batch = RecordBatch(hand_over, failures.append)
    batch.start()
    batch.add({'iter': 1})
    batch.stop()
    assert [str(f) for f in failures] == ['the store is gone']


def test_no_thread_is_started(tmp_path):
    before = set(threading.enumerate())
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5)
    run(trainer)
    assert set(threading.enumerate()) <= before


def test_tensorboard_events_are_handed_over_in_step_order_before_images(tmp_path, flush_every):
    """TensorBoard's scalars wait; an image is written after the scalars logged before it, so the
    event file's steps never go back (TensorBoard would drop what follows)."""
    pytest.importorskip('tensorboard')
    import numpy as np
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from hookloop.logging.images import publish_images
    flush_every(3600.0)

    class Images(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter + 1 == 10:  # step 5's scalars wait (the flush at the epoch's end comes later)
                publish_images(trainer, 'grid', [np.zeros((4, 4, 3), dtype=np.uint8)], 10)

    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook')], interval=5)
    trainer.register_hook(Images())
    run(trainer)
    [path] = glob.glob(str(tmp_path / 'tf_logs' / 'events.out.tfevents.*'))
    steps, tags = [], {}
    for event in EventFileLoader(path).Load():
        for value in event.summary.value:
            steps.append(event.step)
            tags.setdefault(value.tag, []).append(event.step)
    assert steps == sorted(steps)
    assert tags['train/loss'] == [5, 10, 15, 20] and tags['grid/0'] == [10]
    assert not [t for t in flusher.registered() if isinstance(t, RecordBatch)]


def test_a_record_tensorboard_cannot_write_fails_its_next_call(flush_every):
    pytest.importorskip('tensorboard')
    from tensorboard.compat.proto.summary_pb2 import Summary

    from hookloop.hooks.loggers.tensorboard import TensorboardLoggerHook
    flush_every(1e-9)  # each event hands over
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
        with pytest.raises(OverflowError):
            hook.log(None, {'mode': 'train', 'iter': 2, 'loss': 0.5})
        hook.log(None, {'mode': 'train', 'iter': 3, 'loss': 0.25})
        assert written == [3]
    finally:
        hook._batch.stop()


_EXIT = textwrap.dedent('''
    import os, sys
    from hookloop.logging import flusher
    from hookloop.logging.record_batch import RecordBatch
    flusher.set_period(3600.0)

    def hand_over(records):
        with open({path!r}, 'a') as f:
            f.write(' '.join(str(r) for r, _ in records) + '\\n')

    batch = RecordBatch(hand_over, print)
    batch.start()
    batch.add(1)
    batch.add(2)
    pid = os.fork()
    if pid == 0:  # a child that exits as Python does: its copy of the records is not its own
        sys.exit(0)
    os.waitpid(pid, 0)
    {end}
''')


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='fork')
@pytest.mark.parametrize('end', ['pass', 'sys.exit(2)', 'raise RuntimeError("boom")', 'raise KeyboardInterrupt'])
def test_every_exit_python_sees_hands_over_once(tmp_path, end):
    path = tmp_path / 'handed'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get('PYTHONPATH', '')]))
    subprocess.run([sys.executable, '-c', _EXIT.format(path=str(path), end=end)], env=env, timeout=120,
                   capture_output=True)
    assert path.read_text() == '1 2\n'


def test_a_script_that_never_closes_the_trainer_leaves_complete_logs(tmp_path):
    """A user script that trains and exits without ``trainer.close()``: every line and record."""
    script = textwrap.dedent(f'''
        import torch
        from hookloop import Trainer
        from conftest import Regressor, regression_data
        torch.manual_seed(0)
        trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05),
                          train_dataloader=torch.utils.data.DataLoader(regression_data(), batch_size=4),
                          max_epochs=2, work_dir={str(tmp_path)!r}, seed=0, device='cpu',
                          log_config=dict(interval=5, hooks=[dict(type='TextLoggerHook')]))
        trainer.train()
        trainer.logger.info('the last line')
    ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get('PYTHONPATH', '')]))
    subprocess.run([sys.executable, '-c', script], check=True, env=env, timeout=300, capture_output=True)
    from log_utils import json_records
    assert [r['iter'] for r in json_records(tmp_path, 'train')] == [5, 10, 15, 20]
    [log] = glob.glob(os.path.join(tmp_path, '*.log'))
    with open(log, encoding='utf-8') as f:
        lines = f.read().splitlines()
    assert sum('Epoch [' in line for line in lines) == 4 and lines[-1].endswith('the last line')


def test_a_bad_period_is_refused():
    with pytest.raises(ValueError, match='> 0'):
        flusher.set_period(0)
