"""hookloop: a small, fixed PyTorch training loop; everything else is a hook.

The public names are loaded on first use (PEP 562), so ``import hookloop`` — and with it
``hookloop --help`` — does not import torch; ``from hookloop import Trainer`` works as usual.
"""
import importlib

__version__ = '0.1.0'

# public name -> the submodule that defines it
_PUBLIC = {
    'auto_fp16': 'optim.amp', 'force_fp32': 'optim.amp',
    'Config': 'config', 'load_config': 'config', 'seed_everything': 'data.resumable',
    'CheckpointError': 'errors', 'ConfigError': 'errors', 'DataError': 'errors', 'HookloopError': 'errors',
    'InvalidLossError': 'errors',
    'Accuracy': 'engine.evaluator', 'TorchMetricEvaluator': 'engine.evaluator',
    'Hook': 'hooks',
    'Priority': 'priority', 'get_priority': 'priority',
    'DATASETS': 'registry', 'HOOKS': 'registry', 'METRICS': 'registry', 'MODELS': 'registry',
    'OPTIMIZERS': 'registry', 'TRAINERS': 'registry', 'Registry': 'registry',
    'Trainer': 'engine.trainer', 'build_trainer': 'compat.build',
}

__all__ = ['__version__', 'Trainer', 'build_trainer', 'Hook', 'Priority', 'get_priority', 'Registry', 'HOOKS',
           'TRAINERS', 'OPTIMIZERS', 'MODELS', 'DATASETS', 'METRICS', 'Config', 'load_config', 'Accuracy',
           'TorchMetricEvaluator', 'HookloopError', 'ConfigError', 'CheckpointError', 'InvalidLossError',
           'DataError', 'auto_fp16', 'force_fp32', 'seed_everything']


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f'{__name__}.{_PUBLIC[name]}'), name)
    else:
        try:  # a submodule: hookloop.hooks, hookloop.compat, ...
            value = importlib.import_module(f'{__name__}.{name}')
        except ModuleNotFoundError as exc:
            if exc.name != f'{__name__}.{name}':
                raise
            raise AttributeError(f'module {__name__!r} has no attribute {name!r}') from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
