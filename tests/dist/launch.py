"""Launching a test worker under ``torchrun --standalone`` (gloo, CPU), bounded in time: a
launch that runs over its timeout is killed with its workers (its own session) and fails the test."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
WORKER = os.path.join(ROOT, 'tests', 'dist', 'worker.py')


def torchrun(mode, out, timeout=240, env=None, program=None, nproc=2, launch=('--standalone',)):
    """Run ``tests/dist/worker.py`` in ``mode`` on ``nproc`` ranks (or ``program``, a list of
    arguments); ``(completed process, seconds)``."""
    command = [sys.executable, '-m', 'torch.distributed.run', *launch, '--nproc-per-node', str(nproc),
               *(program or [WORKER, mode, str(out)])]
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(WORKER)]),
                    OMP_NUM_THREADS='1', **(env or {}))
    start = time.monotonic()
    # A session of its own: on a timeout the workers are killed with torchrun, not orphaned.
    with subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as popen:
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            stdout, stderr = popen.communicate()
            pytest.fail(f'torchrun {mode or program} ran over {timeout} s:\n{stdout[-3000:]}\n{stderr[-3000:]}')
    proc = subprocess.CompletedProcess(command, popen.returncode, stdout, stderr)
    return proc, time.monotonic() - start


def check_ok(proc):
    assert proc.returncode == 0, f'torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
