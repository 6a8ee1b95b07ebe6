"""The benches run against the code as it is (``bench/overhead.py`` wraps internals to time them:
a rename must not leave them broken) and report every figure the performance docs quote. No
timing is asserted: a few iterations each."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'bench', 'overhead.py'), '--models', 'tiny',
         '--modes', 'default', '--rounds', '1', '--iters', '200', *args],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_overhead_bench_runs_and_reports_its_figures():
    row = _bench()
    for key in ('plain_us', 'hookloop_us', 'framework_us', 'framework_mean_us', 'framework_cycle_us'):
        assert isinstance(row[key], (int, float)), key
    assert row['iters'] == 200 and row['mode'] == 'default' and row['event'] == 'full'
    assert len(row['positions_us']) == 10  # one per position of the log cycle (interval 10)
    assert row['records'] == 20


def test_the_event_ablation_leaves_the_records_out():
    """``--event mark``: the loggers only take their mark: no record is built."""
    row = _bench('--event', 'mark')
    assert row['event'] == 'mark' and row['records'] == 0


def test_the_ema_mode_runs_on_both_models():
    """``--modes ema``: EMAHook(interval=1) against a plain loop with a ``_foreach_lerp_`` EMA."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'bench', 'overhead.py'), '--models', 'tiny,mlp', '--modes', 'ema',
         '--rounds', '1', '--iters', '12', '--block', '4'], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [(row['model'], row['mode'], row['iters']) for row in rows] == [('tiny', 'ema', 12), ('mlp', 'ema', 12)]
    assert all(isinstance(row['ratio'], float) for row in rows)


def _processes(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    result = subprocess.run([sys.executable, os.path.join(ROOT, 'bench', 'processes.py'), '--model', 'mlp',
                             '--iters', '4', '--block', '2', *args],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.strip().splitlines()]


@pytest.mark.parametrize('runs,mode', [(1, 'default'), (2, 'ema')])  # fresh; a sweep
def test_the_two_process_bench_reports_each_run(runs, mode):
    """Fresh (one run per process) and a sweep (several), each loop in its own process."""
    *rows, summary = _processes('--runs', str(runs), '--mode', mode)
    assert [row['run'] for row in rows] == list(range(1, runs + 1))
    for row in rows:
        assert row['ratio'] > 0 and row['plain_ms'] > 0 and row['hookloop_ms'] > 0
        assert row['plain_faults'] >= 0 and row['hookloop_faults'] >= 0
    assert summary['runs'] == runs and summary['mode'] == mode and 'hookloop_faults' in summary
