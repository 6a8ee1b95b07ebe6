"""The built-in hooks; importing this package registers them in ``HOOKS``."""
from .base import STAGES, Hook
from .checkpoint import CheckpointHook
from .evaluation import EvaluationHook
from .loggers import TextLoggerHook
from . import lr_updater, momentum_updater  # noqa: F401  (register <Policy>LrUpdaterHook, <Policy>MomentumUpdaterHook)
from .invalid_loss import CheckInvalidLossHook
from .optimizer import Fp16OptimizerHook, GradientCumulativeOptimizerHook, OptimizerHook, OptimizerProcessor
from .timer import IterTimerHook
from .torch_scheduler import TorchSchedulerHook

__all__ = ['Hook', 'STAGES', 'CheckpointHook', 'CheckInvalidLossHook', 'EvaluationHook', 'Fp16OptimizerHook',
           'GradientCumulativeOptimizerHook', 'IterTimerHook', 'OptimizerHook', 'OptimizerProcessor',
           'TextLoggerHook', 'TorchSchedulerHook']
