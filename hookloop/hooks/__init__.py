"""The built-in hooks; importing this package registers them in ``HOOKS``."""
from .base import STAGES, Hook
from .checkpoint import CheckpointHook
from .evaluation import EvaluationHook
from .loggers import TextLoggerHook
from .invalid_loss import CheckInvalidLossHook
from .optimizer import Fp16OptimizerHook, GradientCumulativeOptimizerHook, OptimizerHook, OptimizerProcessor
from .timer import IterTimerHook

__all__ = ['Hook', 'STAGES', 'CheckpointHook', 'CheckInvalidLossHook', 'Fp16OptimizerHook',
           'GradientCumulativeOptimizerHook', 'EvaluationHook', 'IterTimerHook', 'OptimizerHook',
           'OptimizerProcessor', 'TextLoggerHook']
