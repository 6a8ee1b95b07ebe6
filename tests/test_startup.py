"""``hookloop --help`` starts without importing torch (well under 0.5 s), while ``from
hookloop import Trainer`` and the registries work as before (loaded on first use)."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = '''
import sys
from hookloop.cli import main
for argv in (['--help'], ['train', '--help'], ['plot', '--help']):
    try:
        main(argv)
    except SystemExit:
        pass
print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'matplotlib', 'sklearn'}))
'''


def test_help_imports_no_torch():
    env = dict(os.environ, PYTHONPATH=ROOT)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, '-c', PROBE], env=env, capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert 'usage: hookloop' in proc.stdout and '--resume' in proc.stdout
    assert proc.stdout.strip().endswith('HEAVY []'), proc.stdout[-300:]
    print(f'three --help calls in a fresh interpreter: {seconds:.2f} s')


def test_lazy_package_still_exports_and_registers():
    import hookloop
    from hookloop import HOOKS, TRAINERS, Trainer
    from hookloop.registry import Registry
    assert Trainer.__name__ == 'Trainer' and hookloop.hooks.Hook is hookloop.Hook
    assert 'EMAHook' in HOOKS and 'dreambooth_diffusion' in TRAINERS.keys()
    assert isinstance(HOOKS, Registry) and set(hookloop.__all__) <= set(dir(hookloop))
