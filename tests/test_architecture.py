"""The package layering of docs/architecture.md, checked from the source (nothing is imported).

Every ``import`` under ``hookloop/`` — at module level or inside a function — is resolved
(relative ones included) and compared with the layers: a package imports only packages of
lower layers. Under ``hooks/`` a hook module imports no other hook module, only the support
modules. The packages below ``dist/`` (``checkpoint/`` among them) do not use ``torch.distributed``
at all: no import of it, and no attribute use (``torch.distributed.all_reduce``, ``th.distributed``
after ``import torch as th``, ``getattr(torch, 'distributed')``). And no module outside ``compat/``
grows past 400 lines.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'hookloop'

# Low -> high. A package may import the packages of lower layers (and its own modules), never
# one of its own layer or above. The root ``hookloop/__init__`` sits at the bottom: it loads
# its public names by name on first use and imports nothing of hookloop itself.
LAYERS = [
    {'', 'errors'},
    {'registry', 'priority'},
    {'config'},
    {'fileio'},
    {'checkpoint'},
    {'dist'},
    {'data'},
    {'optim'},
    {'logging'},
    {'hooks'},
    {'engine'},
    {'compat', 'dreambooth', 'examples'},
    {'commands'},
    {'cli'},
    {'__main__'},
]
# The one import against the layers, by design: a sub-command builds its run the way
# ``hookloop train`` does (``plot-lr`` calls ``cli.build_from_config``); ``cli`` loads the commands.
ALSO_ALLOWED = {('commands', 'cli')}

# Under hooks/: the modules a hook module may import (the base class, ordering, schedule
# helpers, the logger base). The two __init__ files import every hook to register it.
HOOK_SUPPORT = {'hookloop.hooks.base', 'hookloop.hooks.order', 'hookloop.hooks.blind_spots',
                'hookloop.hooks.param_schedule', 'hookloop.hooks.loggers.base'}
HOOK_PACKAGES = {'hookloop.hooks', 'hookloop.hooks.loggers'}

MAX_LINES = 400
LINE_LIMITS = {'hookloop/engine/trainer.py': 450}  # the loop and validation (issue #24: <= 450)


def read_modules(root=ROOT):
    """``{dotted name: (source, is_package)}`` of every module under ``root``."""
    modules = {}
    for path in sorted(root.rglob('*.py')):
        parts = path.relative_to(root.parent).with_suffix('').parts
        package = parts[-1] == '__init__'
        modules['.'.join(parts[:-1] if package else parts)] = (path.read_text(encoding='utf-8'), package)
    return modules


def imports_of(name, source, is_package, known):
    """``[(imported module, line)]``: every hookloop module that ``source`` (the module ``name``)
    imports anywhere in its body. ``from X import a`` counts as ``X.a`` when that is a module in
    ``known``, else as ``X``; ``importlib.import_module('...')`` with a literal counts too."""
    package = name if is_package else name.rpartition('.')[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = '.'.join(base[:len(base) - (node.level - 1)])
                module = f'{base}.{node.module}' if node.module else base
            else:
                module = node.module
            submodules = [f'{module}.{alias.name}' for alias in node.names if f'{module}.{alias.name}' in known]
            targets = submodules if len(submodules) == len(node.names) else [module] + submodules
        elif isinstance(node, ast.Call) and getattr(node.func, 'attr', getattr(node.func, 'id', None)) == 'import_module' \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            targets = [node.args[0].value]
        found += [(target, node.lineno) for target in targets if target == 'hookloop' or target.startswith('hookloop.')]
    return found


def package_of(module):
    """``'checkpoint'`` for ``hookloop.checkpoint.format``; ``''`` for the root package."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else ''


def layer_of(package):
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise AssertionError(f'hookloop/{package}: a package docs/architecture.md and LAYERS do not place')


def violations(modules):
    """``{(importer, imported): 'why'}`` for every import against the layers or the hook rule."""
    known = set(modules)
    found = {}
    for name, (source, is_package) in modules.items():
        own = package_of(name)
        for target, line in imports_of(name, source, is_package, known):
            other = package_of(target)
            if other != own and (own, other) not in ALSO_ALLOWED and layer_of(other) >= layer_of(own):
                found[(name, target)] = f'line {line}: {own or "hookloop"}/ may not import {other or "hookloop"}/'
            if name.startswith('hookloop.hooks.') and name not in HOOK_PACKAGES and \
                    (target in HOOK_PACKAGES or target.startswith('hookloop.hooks.')) and target not in HOOK_SUPPORT:
                found[(name, target)] = f'line {line}: a module under hooks/ imports another hook module'
    return found


DIST = 'torch.distributed'


def distributed_uses(source):
    """``[line]``: where ``source`` imports or reaches ``torch.distributed`` (an import of it or
    of a submodule, ``from torch import distributed``, the attribute on ``torch`` or an alias of
    it, ``getattr(torch, 'distributed')``, ``importlib.import_module('torch.distributed...')``)."""
    tree = ast.parse(source)
    torch_names = {'torch'} | {alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
                               for alias in node.names if alias.name == 'torch' and alias.asname}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hit = any(a.name == DIST or a.name.startswith(DIST + '.') for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ''
            hit = not node.level and (module == DIST or module.startswith(DIST + '.') or
                                      (module == 'torch' and any(a.name == 'distributed' for a in node.names)))
        elif isinstance(node, ast.Attribute):
            hit = node.attr == 'distributed' and isinstance(node.value, ast.Name) and node.value.id in torch_names
        elif isinstance(node, ast.Call):
            name = getattr(node.func, 'attr', getattr(node.func, 'id', None))
            values = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
            hit = (name == 'import_module' and any(isinstance(v, str) and v.startswith(DIST) for v in values)) or \
                (name == 'getattr' and 'distributed' in values)
        else:
            hit = False
        if hit:
            lines.append(node.lineno)
    return sorted(set(lines))


def below_dist(package):
    return layer_of(package) < layer_of('dist')


def test_packages_below_dist_do_not_use_torch_distributed():
    found = {name: lines for name, (source, _) in read_modules().items()
             if below_dist(package_of(name)) and (lines := distributed_uses(source))}
    assert not found, '\n'.join(f'{name} uses torch.distributed at lines {lines} (docs/architecture.md: only dist/ '
                                 'and the layers above it know it)' for name, lines in sorted(found.items()))


@pytest.mark.parametrize('source', [
    'import torch\ndef f(x):\n    torch.distributed.all_reduce(x)\n',
    'import torch\nok = torch.distributed.is_available()\n',
    'import torch as th\nok = th.distributed.is_initialized()\n',
    'import torch\ndist = getattr(torch, "distributed")\n',
    'import torch.distributed as dist\n',
    'from torch import distributed\n',
    'def f():\n    from torch.distributed.checkpoint import save\n',
    'import importlib\ndcp = importlib.import_module("torch.distributed.checkpoint")\n',
])
def test_the_checker_sees_every_way_to_reach_torch_distributed(source):
    assert distributed_uses(source)
    assert not distributed_uses('import torch\n"""torch.distributed in a docstring"""\nx = torch.ones(1)\n')


def test_no_import_goes_against_the_layers():
    found = violations(read_modules())
    assert not found, '\n'.join(f'{a} imports {b} ({why})' for (a, b), why in sorted(found.items()))


def line_count(relative):
    return len((ROOT.parent / relative).read_text(encoding='utf-8').splitlines())


def test_every_package_is_placed_in_a_layer():
    for name in read_modules():
        layer_of(package_of(name))


SYNTHETIC = {
    'hookloop': ('', True),
    'hookloop.errors': ('', False),
    'hookloop.checkpoint': ('', True),
    'hookloop.checkpoint.format': ('from ..errors import CheckpointError\n', False),
    'hookloop.engine': ('', True),
    'hookloop.engine.trainer': ('from ..checkpoint import format\nfrom .. import errors\n', False),
    'hookloop.hooks': ('from . import ema, checkpoint\n', True),
    'hookloop.hooks.base': ('from ..errors import HookloopError\n', False),
    'hookloop.hooks.ema': ('from .base import Hook\n', False),
    'hookloop.hooks.checkpoint': ('from .base import Hook\n', False),
}


@pytest.mark.parametrize('name, source, expected', [
    ('hookloop.checkpoint.bad', 'def restore():\n    from ..engine.trainer import Trainer\n',
     ('hookloop.checkpoint.bad', 'hookloop.engine.trainer')),
    ('hookloop.checkpoint.bad', 'import hookloop.engine\n', ('hookloop.checkpoint.bad', 'hookloop.engine')),
    ('hookloop.checkpoint', 'from ..engine import trainer\n', ('hookloop.checkpoint', 'hookloop.engine.trainer')),
    ('hookloop.hooks.ema', 'from .base import Hook\nfrom .checkpoint import CheckpointHook\n',
     ('hookloop.hooks.ema', 'hookloop.hooks.checkpoint')),
    ('hookloop.hooks.ema', 'from . import checkpoint\n', ('hookloop.hooks.ema', 'hookloop.hooks.checkpoint')),
    ('hookloop.hooks.ema', 'from ..hooks import CheckpointHook\n', ('hookloop.hooks.ema', 'hookloop.hooks')),
    ('hookloop.errors', 'import importlib\nimportlib.import_module("hookloop.engine.trainer")\n',
     ('hookloop.errors', 'hookloop.engine.trainer')),
])
def test_the_checker_catches_a_planted_violation(name, source, expected):
    modules = dict(SYNTHETIC)
    assert violations(modules) == {}  # the synthetic tree is clean ...
    is_package = modules.get(name, ('', False))[1]
    modules[name] = (source, is_package)
    assert expected in violations(modules)  # ... until the planted import


def test_no_module_outside_compat_is_over_400_lines():
    over = {}
    for path in sorted(ROOT.rglob('*.py')):
        relative = path.relative_to(ROOT.parent).as_posix()
        if relative.startswith('hookloop/compat/'):
            continue
        lines = line_count(relative)
        if lines > LINE_LIMITS.get(relative, MAX_LINES):
            over[relative] = lines
    assert not over, f'over {MAX_LINES} lines (split by concept): {over}'
