"""hookloop: a small, fixed PyTorch training loop; everything else is a hook."""
__version__ = '0.1.0'

from . import hooks  # noqa: E402,F401  (registers the built-in hooks)
from .amp import auto_fp16, force_fp32  # noqa: E402
from .config import Config, load_config  # noqa: E402
from .data import seed_everything  # noqa: E402
from . import hf_dataset  # noqa: E402,F401  (registers the HFDataset dataset type)
from .errors import CheckpointError, ConfigError, DataError, HookloopError, InvalidLossError  # noqa: E402
from .evaluation import Accuracy, TorchMetricEvaluator  # noqa: E402
from .hooks import Hook  # noqa: E402
from .priority import Priority, get_priority  # noqa: E402
from .registry import DATASETS, HOOKS, METRICS, MODELS, OPTIMIZERS, TRAINERS, Registry  # noqa: E402
from .trainer import Trainer, build_trainer  # noqa: E402
from . import dreambooth  # noqa: E402,F401  (registers the dreambooth_diffusion trainer)

__all__ = ['__version__', 'Trainer', 'build_trainer', 'Hook', 'Priority', 'get_priority', 'Registry', 'HOOKS',
           'TRAINERS', 'OPTIMIZERS', 'MODELS', 'DATASETS', 'METRICS', 'Config', 'load_config', 'Accuracy',
           'TorchMetricEvaluator', 'HookloopError', 'ConfigError', 'CheckpointError', 'InvalidLossError',
           'DataError']
__all__ += ['auto_fp16', 'force_fp32', 'seed_everything']
