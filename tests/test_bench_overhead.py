"""``bench/overhead.py`` runs against the code as it is (it wraps internals to time them: a
rename must not leave it broken) and reports every figure the performance docs quote."""
import json
import os
import subprocess
import sys

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
