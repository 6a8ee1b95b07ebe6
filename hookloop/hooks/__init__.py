"""The built-in hooks; importing this package registers them in ``HOOKS``. One hook per module; a
hook module imports only the support modules (base, order, blind_spots, param_schedule, loggers.base).
May import: ``logging``, ``optim``, ``data``, ``dist``, ``checkpoint``, ``fileio`` and below; never ``engine``."""
from . import lr_updater, momentum_updater  # noqa: F401  (register <Policy>LrUpdaterHook, <Policy>MomentumUpdaterHook)
from .base import NEVER, STAGES, Hook
from .checkpoint import CheckpointHook
from .ema import EMAHook
from .evaluation import EvaluationHook
from .finite_loss import FiniteLossGuard
from .invalid_loss import CheckInvalidLossHook
from .loggers import (DvcliveLoggerHook, LoggerHook, MlflowLoggerHook, NeptuneLoggerHook, TensorboardLoggerHook,
                      TextLoggerHook, WandbLoggerHook)
from .optimizer import Fp16OptimizerHook, GradientCumulativeOptimizerHook, OptimizerHook, OptimizerProcessor
from .preemption import PreemptionHook
from .progress import ProgressBarHook
from .timer import IterTimerHook
from .torch_scheduler import TorchSchedulerHook
from .work_dir_lock import WorkDirLockHook

__all__ = ['Hook', 'NEVER', 'STAGES', 'CheckpointHook', 'CheckInvalidLossHook', 'EMAHook', 'EvaluationHook', 'FiniteLossGuard',
           'Fp16OptimizerHook', 'GradientCumulativeOptimizerHook', 'IterTimerHook', 'OptimizerHook',
           'OptimizerProcessor', 'PreemptionHook', 'TextLoggerHook', 'LoggerHook', 'TensorboardLoggerHook',
           'MlflowLoggerHook', 'WandbLoggerHook', 'NeptuneLoggerHook', 'DvcliveLoggerHook', 'ProgressBarHook',
           'TorchSchedulerHook', 'WorkDirLockHook']
