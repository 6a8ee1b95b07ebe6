"""The built-in hooks; importing this package registers them in ``HOOKS``."""
from .base import STAGES, Hook
from .checkpoint import CheckpointHook
from .ema import EMAHook
from .evaluation import EvaluationHook
from .loggers import TextLoggerHook
from .optimizer import OptimizerHook, OptimizerProcessor
from .preemption import PreemptionHook
from .timer import IterTimerHook

__all__ = ['Hook', 'STAGES', 'CheckpointHook', 'EvaluationHook', 'IterTimerHook', 'OptimizerHook',
           'OptimizerProcessor', 'TextLoggerHook']
__all__ += ['EMAHook', 'PreemptionHook']
