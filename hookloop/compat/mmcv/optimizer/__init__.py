"""``mmcv.runner.optimizer``: the optimizer builders and registries (:mod:`.builder`)."""
from ....optim.constructor import DefaultOptimizerConstructor, build_optimizers
from .builder import OPTIMIZER_BUILDERS, OPTIMIZERS, TORCH_OPTIMIZERS, build_optimizer, build_optimizer_constructor

__all__ = ['OPTIMIZER_BUILDERS', 'OPTIMIZERS', 'TORCH_OPTIMIZERS', 'DefaultOptimizerConstructor', 'build_optimizer',
           'build_optimizer_constructor', 'build_optimizers']
