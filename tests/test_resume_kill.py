"""kill -9 at random moments, including in the middle of writing a checkpoint; resuming with
``--resume auto`` each time ends bitwise equal to a run that was never interrupted.

The runs are forks of the test process running the CLI's ``main(['train', CONFIG,
'--resume', 'auto'])``: a fresh interpreter costs seconds of ``import torch`` each. A real
``python -m hookloop train`` process is tested in ``test_preemption.py``."""
import glob
import os
import random
import signal
import time

import pytest

from hookloop.checkpoint.format import load_checkpoint, read_pointer
from resume_helpers import ForkedRun, assert_states_equal, comparable, kill_leftovers, reference_run, write_config


def wait_for(condition, process, timeout=120, step=0.002):
    """Poll ``condition()`` until true; False if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(step)
    raise AssertionError('timed out waiting for the training process')


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    kill_leftovers()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_at_random_points_then_resume_auto_matches_uninterrupted_run(tmp_path):
    config = write_config(tmp_path, delay=0.004, max_epochs=4)  # 20 iterations, a checkpoint after each
    reference = reference_run(config, tmp_path / 'reference')
    work_dir = tmp_path / 'run'
    rng = random.Random(5)
    kills = []
    while len(kills) < 3:
        before = read_pointer(str(work_dir))
        process = ForkedRun(config, work_dir, str(tmp_path / f'run_{len(kills)}.log'))
        # Let it make progress (a new checkpoint), then kill it at a random moment after that.
        if not wait_for(lambda: read_pointer(str(work_dir)) not in (None, before), process):
            break  # finished before we could kill it
        time.sleep(rng.uniform(0.0, 0.25))
        process.send_signal(signal.SIGKILL)
        process.wait()
        # Whatever the moment, the pointer names a complete, loadable checkpoint.
        latest = read_pointer(str(work_dir))
        kills.append(load_checkpoint(latest)['meta']['iter'])
    assert len(kills) == 3, f'the run finished too fast to be killed 3 times (killed after {kills})'
    assert kills[-1] < 20
    last = ForkedRun(config, work_dir, str(tmp_path / 'last.log'))
    assert last.wait(timeout=180) == 0, last.output()[-3000:]
    final = load_checkpoint(read_pointer(str(work_dir)))
    assert final['meta']['iter'] == 20
    assert_states_equal(comparable(final), comparable(load_checkpoint(read_pointer(str(reference.work_dir)))))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_sigkill_while_a_100mb_checkpoint_is_being_written_then_resume(tmp_path, async_save):
    """With ``async_save`` the kill lands while the background thread writes and the
    loop has gone on training: the previous checkpoint stays the loadable latest."""
    big = 25_000_000  # float32 values: 100 MB per checkpoint
    # saves after iterations 2, 4, 5
    config = write_config(tmp_path, big=big, max_epochs=1, interval=2, async_save=async_save)
    work_dir = tmp_path / 'run'
    process = ForkedRun(config, work_dir, str(tmp_path / 'killed.log'))

    def growing_second_save():
        # The first save is complete (the pointer exists); the next one is still a temporary file.
        if read_pointer(str(work_dir)) is None:
            return False
        partial = glob.glob(str(work_dir / '.iter_4.pth.*.tmp'))
        return bool(partial) and os.path.getsize(partial[0]) > 0

    assert wait_for(growing_second_save, process, step=0.001), 'the save was not caught in progress'
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = glob.glob(str(work_dir / '.iter_4.pth.*.tmp'))
    assert partial and os.path.getsize(partial[0]) < big * 4, 'the checkpoint was complete when killed'
    assert not os.path.exists(work_dir / 'iter_4.pth')
    assert read_pointer(str(work_dir)) == str(work_dir / 'iter_2.pth')
    assert load_checkpoint(str(work_dir / 'iter_2.pth'))['meta']['iter'] == 2

    resumed = ForkedRun(config, work_dir, str(tmp_path / 'resumed.log'))
    assert resumed.wait(timeout=180) == 0, resumed.output()[-3000:]
    logs = ''.join(open(path).read() for path in glob.glob(str(work_dir / '*.log')))
    assert 'resumed from ' + str(work_dir / 'iter_2.pth') in logs
    assert not glob.glob(str(work_dir / '.*.tmp'))  # the torn file was cleaned up
    final = load_checkpoint(read_pointer(str(work_dir)))
    assert final['meta']['iter'] == 5
    reference = reference_run(config, tmp_path / 'reference', ['checkpoint_config.interval=-1'])
    expected = comparable(load_checkpoint(read_pointer(str(reference.work_dir))))
    assert_states_equal(comparable(final), expected)
    assert final['state_dict']['ballast'].numel() == big
