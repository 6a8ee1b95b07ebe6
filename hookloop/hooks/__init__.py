"""The built-in hooks; importing this package registers them in ``HOOKS``."""
from . import lr_updater, momentum_updater  # noqa: F401  (register <Policy>LrUpdaterHook, <Policy>MomentumUpdaterHook)
from .base import STAGES, Hook
from .checkpoint import CheckpointHook
from .ema import EMAHook
from .evaluation import EvaluationHook
from .loggers import (DvcliveLoggerHook, LoggerHook, MlflowLoggerHook, NeptuneLoggerHook, TensorboardLoggerHook,
                      TextLoggerHook, WandbLoggerHook)
from .optimizer import OptimizerHook, OptimizerProcessor
from .preemption import PreemptionHook
from .progress import ProgressBarHook
from .timer import IterTimerHook
from .torch_scheduler import TorchSchedulerHook

__all__ = ['Hook', 'STAGES', 'CheckpointHook', 'EMAHook', 'EvaluationHook', 'IterTimerHook', 'OptimizerHook',
           'OptimizerProcessor', 'PreemptionHook', 'TextLoggerHook', 'LoggerHook', 'TensorboardLoggerHook',
           'MlflowLoggerHook', 'WandbLoggerHook', 'NeptuneLoggerHook', 'DvcliveLoggerHook', 'ProgressBarHook',
           'TorchSchedulerHook']
