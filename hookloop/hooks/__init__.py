"""The built-in hooks; importing this package registers them in ``HOOKS``."""
from .base import STAGES, Hook
from .checkpoint import CheckpointHook
from .evaluation import EvaluationHook
from .loggers import TextLoggerHook
from .optimizer import OptimizerHook, OptimizerProcessor
from .timer import IterTimerHook

__all__ = ['Hook', 'STAGES', 'CheckpointHook', 'EvaluationHook', 'IterTimerHook', 'OptimizerHook',
           'OptimizerProcessor', 'TextLoggerHook']
