"""``Trainer(compile=...)``: the step calls the model through ``torch.compile``.

The user's module is compiled in place (``nn.Module.compile``: its ``__call__`` goes through
``torch.compile``), so ``trainer.model`` keeps its class and its ``state_dict`` keys (no
``_orig_mod.`` prefix, as ``torch.compile(model)`` would add): checkpoints load into a compiled
or an eager run alike, and DDP / FSDP wrappers stay what they are around it.
"""
from collections.abc import Mapping

import torch

from ..errors import ConfigError

COMPILE_OPTIONS = ('mode', 'fullgraph', 'dynamic', 'backend', 'options')


def compile_options(value):
    """``compile=`` checked: None (no compilation) or the keyword arguments of ``torch.compile``."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f'compile must be True, False or a dict of torch.compile options '
                          f'({", ".join(COMPILE_OPTIONS)}), got {value!r}')
    unknown = sorted(set(value) - set(COMPILE_OPTIONS))
    if unknown:
        raise ConfigError(f'compile got unknown option(s) {unknown}; torch.compile takes {", ".join(COMPILE_OPTIONS)}')
    return dict(value)


def compile_model(model, options):
    """Compile ``model``'s calls in place with ``options`` (nothing when None); returns it."""
    if options is None:
        return model
    if not hasattr(torch.nn.Module, 'compile'):
        raise ConfigError(f'compile=... needs nn.Module.compile (torch >= 2.2), not torch {torch.__version__}')
    model.compile(**options)
    return model
