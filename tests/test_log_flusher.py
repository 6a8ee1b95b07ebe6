"""The log files' lines are flushed by a timer and at the points where someone reads them,
never lost at a run's end, never written twice by a forked child."""
import glob
import os
import threading
import time

import pytest

from hookloop import Hook
from hookloop.logging import flusher
from log_utils import json_records, make_trainer, run


def _lines(work_dir, suffix):
    [path] = glob.glob(os.path.join(work_dir, f'*{suffix}'))
    with open(path, encoding='utf-8') as f:
        return f.read().splitlines()


def _flusher_thread():
    return any(t.name == 'hookloop-log-flusher' for t in threading.enumerate())


def _registered_under(directory):
    """The files under ``directory`` the flusher still flushes (a handler's, or a file's)."""
    names = [getattr(target, 'baseFilename', None) or getattr(target, 'name', None) or getattr(target, 'log_dir', '')
             for target in flusher._files]
    return [name for name in names if str(name).startswith(str(directory))]


def test_a_line_waits_in_the_buffer_then_the_flusher_writes_it(tmp_path, monkeypatch, flush_every):
    """No system call per line: the record of iteration 5 is not on disk one iteration
    later; with a short period the flusher's thread writes it while the run goes on."""
    seen = {}

    class Look(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter == 5:  # the iteration after the first log event (iter 5 = 6 done)
                seen['buffered'] = [r['iter'] for r in json_records(tmp_path, 'train')]
                seen['log'] = [line for line in _lines(tmp_path, '.log') if 'Epoch [1][5/10]' in line]
                flush_every(0.01)
                flusher.flush_logs()  # what the thread does at its next wake (the old period may be long)
                seen['flushed'] = [r['iter'] for r in json_records(tmp_path, 'train')]

    flush_every(3600.0)
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5)
    trainer.register_hook(Look())
    run(trainer)
    assert seen['buffered'] == [] and seen['log'] == []
    assert seen['flushed'] == [5]


def test_the_thread_flushes_mid_epoch(tmp_path, monkeypatch, flush_every):
    flush_every(0.01)
    seen = []

    class Wait(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter == 5:
                for _ in range(2000):  # up to ~20 s on a busy machine; no time is asserted
                    seen[:] = [r['iter'] for r in json_records(tmp_path, 'train')]
                    if seen:
                        break
                    time.sleep(0.01)

    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5)
    trainer.register_hook(Wait())
    run(trainer)
    assert seen == [5]


def test_lines_are_on_disk_before_a_checkpoint_and_after_run(tmp_path, monkeypatch, flush_every):
    """Before a checkpoint is built, the lines of the iterations before its own are on disk (its
    own iteration's line comes after it: loggers run last); after_run hooks (uploads, copies)
    see complete files."""
    flush_every(3600.0)
    seen = {}

    class Read(Hook):
        def before_save_checkpoint(self, trainer, checkpoint):
            seen.setdefault('save', []).append((trainer.iter, [r['iter'] for r in json_records(tmp_path, 'train')]))

        def after_run(self, trainer):
            seen['end'] = [r['iter'] for r in json_records(tmp_path, 'train')]
            seen['end_log'] = sum('Epoch [2][10/10]' in line for line in _lines(tmp_path, '.log'))

    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5,
                           checkpoint_config=dict(interval=5, by_epoch=False))
    trainer.register_hook(Read(), priority='HIGHEST')
    run(trainer)
    assert seen['save'][:2] == [(4, []), (9, [5])]  # trainer.iter 4: 5 iterations done
    assert seen['end'] == [5, 10, 15, 20] and seen['end_log'] == 1
    assert _registered_under(tmp_path) == []


def test_a_failed_run_loses_no_line_and_leaves_no_thread(tmp_path, monkeypatch, flush_every):
    flush_every(3600.0)

    class Fail(Hook):
        def after_train_iter(self, trainer):
            if trainer.iter == 6:
                raise RuntimeError('boom')

    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook')], interval=5)
    trainer.register_hook(Fail())
    with pytest.raises(RuntimeError, match='boom'):
        trainer.train()
    trainer.close()
    assert [r['iter'] for r in json_records(tmp_path, 'train')] == [5]
    assert any('Epoch [1][5/10]' in line for line in _lines(tmp_path, '.log'))
    assert _registered_under(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='fork')
def test_a_forked_child_does_not_write_the_parents_lines_again(tmp_path, monkeypatch, flush_every):
    """A child (a DataLoader worker started by fork) inherits the file buffers: they are
    flushed before the fork, so a child that flushes its copy writes nothing twice."""
    flush_every(3600.0)
    path = tmp_path / 'x.log.json'
    f = open(path, 'ab')
    flusher.register(f)
    try:
        f.write(b'one\n')
        pid = os.fork()
        if pid == 0:  # the child: flush its copy of the buffer, as a normal exit would
            try:
                f.flush()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        f.write(b'two\n')
    finally:
        flusher.unregister(f)
        f.close()
    assert path.read_bytes() == b'one\ntwo\n'


def test_unregister_flushes_and_a_closed_file_is_no_error(tmp_path):
    alone = not flusher._files  # (a trainer of an earlier test in this process may still hold its files)
    f, g = open(tmp_path / 'a', 'ab'), open(tmp_path / 'b', 'ab')
    flusher.register(f)
    flusher.register(g)
    f.write(b'a\n')
    g.close()  # closed behind the flusher's back: its flush is skipped, not raised
    flusher.flush_logs()
    flusher.unregister(g)
    assert (tmp_path / 'a').read_bytes() == b'a\n'
    assert _flusher_thread()  # f is still registered
    flusher.unregister(f)
    f.close()
    assert _registered_under(tmp_path) == []
    if alone:
        assert not _flusher_thread()  # the thread ends with the last file


def test_tensorboard_events_are_handed_over_in_step_order_before_images(tmp_path, monkeypatch, flush_every):
    """TensorBoard's scalars wait for the flusher; an image is written after the scalars logged
    before it, so the event file's steps never go back (TensorBoard would drop what follows)."""
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
    assert _registered_under(tmp_path) == []


def test_a_script_that_never_closes_the_trainer_leaves_complete_logs(tmp_path):
    """A user script that trains and exits without ``trainer.close()``: the JSON log closed with
    the run, the ``.log`` at the interpreter's exit (logging's shutdown flushes its handlers)."""
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f'''
        import torch
        from hookloop import Trainer
        from conftest import Regressor, regression_data
        from hookloop.logging import flusher
        flusher.set_period(3600.0)
        torch.manual_seed(0)
        trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05),
                          train_dataloader=torch.utils.data.DataLoader(regression_data(), batch_size=4),
                          max_epochs=2, work_dir={str(tmp_path)!r}, seed=0, device='cpu',
                          log_config=dict(interval=5, hooks=[dict(type='TextLoggerHook')]))
        trainer.train()
        trainer.logger.info('the last line')
    ''')
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests_dir, os.environ.get('PYTHONPATH', '')]))
    subprocess.run([sys.executable, '-c', script], check=True, env=env, timeout=300, capture_output=True)
    assert [r['iter'] for r in json_records(tmp_path, 'train')] == [5, 10, 15, 20]
    lines = _lines(tmp_path, '.log')
    assert sum('Epoch [' in line for line in lines) == 4 and lines[-1].endswith('the last line')


def test_a_new_period_reaches_the_thread_while_it_waits(flush_every):
    """The thread waits with the period it had; ``set_period`` wakes it (a thread that outlives
    one run, e.g. for a trainer never closed, must not keep an hour's wait)."""
    flushed = threading.Event()

    class Target:
        def flush(self):
            flushed.set()

    flush_every(3600.0)
    target = Target()
    flusher.register(target)  # the thread starts and waits an hour
    try:
        flush_every(0.01)
        assert flushed.wait(60)  # no time asserted: an hour's wait would fail it
    finally:
        flusher.unregister(target)
    with pytest.raises(ValueError, match='> 0'):
        flusher.set_period(0)
