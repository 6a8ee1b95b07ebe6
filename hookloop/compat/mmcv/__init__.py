"""The ``mmcv.runner`` names user code imports, as thin adapters over hookloop's Trainer.

Code written for MMCV 1.x runs with its import line changed::

    from hookloop.compat.mmcv import EpochBasedRunner, get_logger   # was: from mmcv.runner import ...

    runner = EpochBasedRunner(model, optimizer=optimizer, work_dir='./work_dir', logger=logger, max_epochs=4)
    runner.register_training_hooks(lr_config=dict(policy='step', step=[2, 3]),
                                   optimizer_config=dict(grad_clip=None), checkpoint_config=dict(interval=1),
                                   log_config=dict(interval=100, hooks=[dict(type='TextLoggerHook')]))
    runner.run([trainloader], [('train', 1)])

A runner holds one :class:`~hookloop.Trainer` (``runner.trainer``); every step, schedule,
checkpoint and log line is the Trainer's and its hooks'. What the adapter adds is MMCV's
shape: loaders given to ``run``, ``workflow``, ``latest.pth`` next to ``last_checkpoint``,
``meta`` in checkpoints, ``load_checkpoint(revise_keys=...)``. A model with
``train_step(data_batch, optimizer)`` is driven through it (see docs/migration.md).

The package: ``runner`` (the runners), ``eval_hook`` (``EvalHook``), ``loggers`` (MMCV's
logger formats), and the module paths MMCV code imports, so a rename-only alias
(``mmcv.runner[.x]`` -> ``hookloop.compat.mmcv[.x]``, ``mmcv.parallel``, ``mmcv.utils``,
``mmcv.fileio``, ``mmcv.engine`` -> ``hookloop.compat.mmcv.<same>``) is enough: ``hooks``
(``.hook``, ``.lr_updater``, ``.momentum_updater``, ``.evaluation``), ``fp16_utils``,
``checkpoint``, ``dist_utils``, ``optimizer`` (``.builder``), ``parallel`` (``.registry``),
``utils`` (``.ext_loader``), ``fileio`` (``.file_client``) and ``engine``.
"""
import torch

from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn import SyncBatchNorm

from ...optim.amp import auto_fp16, cast_tensor_type, enable_fp16, force_fp32
from ...dist.process_group import get_rank, get_world_size, init_distributed
from ...errors import ConfigAssertionError, ConfigError, ConfigTypeError
from ...hooks import (CheckpointHook, EMAHook, Hook, IterTimerHook, LoggerHook, TensorboardLoggerHook,
                      TextLoggerHook)
from ...hooks import optimizer as _optimizer_hooks
from ...hooks import lr_updater, momentum_updater
from ...optim.constructor import DefaultOptimizerConstructor, OPTIMIZER_CONSTRUCTORS, build_optimizer, \
    build_optimizers
from ...priority import Priority, get_priority
from ...registry import HOOKS, Registry
from ...optim.schedules import annealing_cos, annealing_linear
from .checkpoint import CheckpointLoader, _load_checkpoint, load_checkpoint, save_checkpoint
from .eval_hook import DistEvalHook, EvalHook
from .optimizer_step import DrivenByMMCVCode
from .optimizer import OPTIMIZER_BUILDERS, OPTIMIZERS, build_optimizer_constructor
from .parallel import MMDataParallel, MMDistributedDataParallel, is_module_wrapper
from .runner import LATEST_LINK, RUNNERS, BaseRunner, EpochBasedRunner, IterBasedRunner, build_runner, link_latest  # noqa: F401,E501
from .utils import build_from_cfg, get_logger, print_log

def get_dist_info():
    """``(rank, world_size)``; ``(0, 1)`` outside a process group."""
    return get_rank(), get_world_size()


def init_dist(launcher, backend='nccl', **kwargs):
    """Join the process group (``launcher='pytorch'``: torchrun's environment)."""
    if launcher not in ('pytorch', 'none'):
        raise ConfigError(f'init_dist launcher {launcher!r} is not supported; use torchrun with launcher="pytorch"')
    if backend == 'nccl' and not torch.cuda.is_available():
        backend = 'gloo'
    return init_distributed('pytorch' if launcher == 'pytorch' else 'none', backend)


def wrap_fp16_model(model):
    """Turn on MMCV's ``fp16_enabled`` switches. The weights stay float32: ``auto_fp16``
    runs the decorated methods under fp16 autocast instead of casting the model to half."""
    enable_fp16(model)
    return model


def master_only(func):
    """Run ``func`` on rank 0 only (returns None elsewhere)."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if get_rank() == 0:
            return func(*args, **kwargs)
    return wrapper


# MMCV's logger formats (learning_rate / momentum tags, MMCV's steps); the native hooks keep hookloop's
from .loggers import (ClearMLLoggerHook, DvcliveLoggerHook, MlflowLoggerHook, NeptuneLoggerHook,  # noqa: E402
                      PaviLoggerHook, SegmindLoggerHook, SyncBuffersHook, WandbLoggerHook)


def mmcv_asserting(cls, *mixins):
    """``cls`` with MMCV's exception type for bad arguments: MMCV asserts them, so the
    ConfigError hookloop raises becomes a :class:`ConfigAssertionError` (also an
    ``AssertionError`` and still a ``ValueError``). ``mixins`` go before ``cls`` in the bases."""
    import functools

    @functools.wraps(cls.__init__)
    def __init__(self, *args, **kwargs):
        try:
            cls.__init__(self, *args, **kwargs)
        except ConfigAssertionError:
            raise
        except ConfigError as exc:
            raise ConfigAssertionError(str(exc)) from None
    return type(cls.__name__, mixins + (cls,), {'__init__': __init__, '__doc__': cls.__doc__, '__module__': __name__})


def _schedule_hooks():
    names = {}
    for module in (lr_updater, momentum_updater):
        for name, value in vars(module).items():
            if name.endswith(('LrUpdaterHook', 'MomentumUpdaterHook')) and isinstance(value, type):
                names[name] = mmcv_asserting(value)
    return names


SCHEDULE_HOOKS = _schedule_hooks()  # built once: mmcv.runner and mmcv.runner.hooks.lr_updater share the classes
globals().update(SCHEDULE_HOOKS)
# The optimizer hooks, with MMCV's exception types for their arguments and MMCV's step when
# code other than a hookloop trainer calls them (optimizer_step.py).
OptimizerHook = mmcv_asserting(_optimizer_hooks.OptimizerHook, DrivenByMMCVCode)
Fp16OptimizerHook = mmcv_asserting(_optimizer_hooks.Fp16OptimizerHook, DrivenByMMCVCode)
GradientCumulativeOptimizerHook = mmcv_asserting(_optimizer_hooks.GradientCumulativeOptimizerHook, DrivenByMMCVCode)
GradientCumulativeFp16OptimizerHook = mmcv_asserting(_optimizer_hooks.GradientCumulativeFp16OptimizerHook,
                                                     DrivenByMMCVCode)

__all__ = ['EpochBasedRunner', 'IterBasedRunner', 'BaseRunner', 'RUNNERS', 'build_runner', 'HOOKS', 'Hook',
           'OptimizerHook', 'Fp16OptimizerHook', 'GradientCumulativeOptimizerHook',
           'GradientCumulativeFp16OptimizerHook', 'EMAHook', 'CheckpointHook', 'EvalHook', 'DistEvalHook',
           'IterTimerHook', 'LoggerHook', 'TextLoggerHook', 'TensorboardLoggerHook', 'MlflowLoggerHook',
           'WandbLoggerHook', 'NeptuneLoggerHook', 'DvcliveLoggerHook', 'build_optimizer', 'build_optimizers',
           'DefaultOptimizerConstructor', 'OPTIMIZER_CONSTRUCTORS', 'load_checkpoint', 'save_checkpoint',
           'get_dist_info', 'init_dist', 'auto_fp16', 'force_fp32', 'wrap_fp16_model', 'Priority', 'get_priority',
           'get_logger', 'MMDataParallel', 'MMDistributedDataParallel', 'is_module_wrapper', 'annealing_cos',
           'annealing_linear', 'OPTIMIZER_BUILDERS', 'OPTIMIZERS', 'SyncBatchNorm', '_BatchNorm', '_ConvNd',
           'cast_tensor_type', 'master_only', 'SyncBuffersHook', 'PaviLoggerHook', 'ClearMLLoggerHook',
           'SegmindLoggerHook', 'Registry', 'build_from_cfg', 'print_log', 'CheckpointLoader', '_load_checkpoint',
           'build_optimizer_constructor'] + sorted(SCHEDULE_HOOKS)
