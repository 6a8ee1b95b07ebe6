"""``mmcv.runner.optimizer.builder``: the registries and builders repository code imports
(mmselfsup's ``from mmcv.runner.optimizer.builder import OPTIMIZERS, OPTIMIZER_BUILDERS``).

``OPTIMIZERS`` is hookloop's registry of optimizer classes (every ``torch.optim`` optimizer
by its class name, and, as in MMCV, the abstract ``Optimizer`` too); ``OPTIMIZER_BUILDERS``
is :data:`hookloop.optim.constructor.OPTIMIZER_CONSTRUCTORS`, where a repository's
constructor registers (``register_module(force=True)`` replaces hookloop's default, as in MMCV).
"""
import torch

from ....optim.constructor import OPTIMIZER_CONSTRUCTORS, build_optimizer
from ....registry import OPTIMIZERS
from ..utils import build_from_cfg

OPTIMIZER_BUILDERS = OPTIMIZER_CONSTRUCTORS
if 'Optimizer' not in OPTIMIZERS:
    OPTIMIZERS.register_module(module=torch.optim.Optimizer)
# The names MMCV's register_torch_optimizers() returns: every Optimizer class of torch.optim.
TORCH_OPTIMIZERS = sorted(name for name in dir(torch.optim) if isinstance(getattr(torch.optim, name), type)
                          and issubclass(getattr(torch.optim, name), torch.optim.Optimizer))


def build_optimizer_constructor(cfg):
    """``OPTIMIZER_BUILDERS.build(cfg)``: ``dict(type='DefaultOptimizerConstructor',
    optimizer_cfg=..., paramwise_cfg=...)``, MMCV's call."""
    return build_from_cfg(cfg, OPTIMIZER_BUILDERS)


__all__ = ['OPTIMIZERS', 'OPTIMIZER_BUILDERS', 'TORCH_OPTIMIZERS', 'build_optimizer', 'build_optimizer_constructor']
