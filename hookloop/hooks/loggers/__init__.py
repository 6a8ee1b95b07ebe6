"""Logger hooks: the text/JSON log and the experiment trackers (each tracker's library is
an optional extra, imported when the hook is built)."""
from .base import LoggerHook
from .dvclive import DvcliveLoggerHook
from .mlflow import MlflowLoggerHook
from .neptune import NeptuneLoggerHook
from .tensorboard import TensorboardLoggerHook
from .text import TextLoggerHook
from .wandb import WandbLoggerHook

__all__ = ['LoggerHook', 'TextLoggerHook', 'TensorboardLoggerHook', 'MlflowLoggerHook', 'WandbLoggerHook',
           'NeptuneLoggerHook', 'DvcliveLoggerHook']
