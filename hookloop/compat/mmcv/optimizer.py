"""``mmcv.runner.optimizer``: the optimizer builders and registries."""
from . import (OPTIMIZER_BUILDERS, OPTIMIZERS, DefaultOptimizerConstructor, build_optimizer,  # noqa: F401
               build_optimizers)
