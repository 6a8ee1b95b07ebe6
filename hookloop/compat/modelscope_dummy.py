"""ModelScope's ``'dummy'`` trainer (``modelscope.trainers.base.DummyTrainer``): it reads a
configuration file and trains nothing. ``train()`` prints the file's ``train`` section,
``evaluate(checkpoint_path=None)`` its ``evaluation`` section and the checkpoint path, as
ModelScope's does; ModelScope's trainer test uses it to check that a configuration file loads
through ``build_trainer('dummy', dict(cfg_file=...))``."""
import time

from ..errors import ConfigError
from ..registry import TRAINERS
from .modelscope_config import load_configuration


@TRAINERS.register_module(module_name=['dummy', 'DummyTrainer'])
class DummyTrainer:
    """``DummyTrainer(cfg_file)``: ``cfg`` (the configuration, attribute access) and
    ``timestamp``; other arguments are refused (ModelScope's would ignore them)."""

    takes_modelscope_arguments = True  # build_trainer passes the arguments as they are

    def __init__(self, cfg_file, **kwargs):
        if kwargs:
            raise ConfigError(f"the 'dummy' trainer takes cfg_file only, got {sorted(kwargs)}")
        self.cfg = load_configuration(cfg_file)
        self.timestamp = time.strftime('%Y%m%d_%H%M%S')

    def train(self):
        print(f'train cfg {self.cfg.get("train")}')

    def evaluate(self, checkpoint_path=None):
        print(f'eval cfg {self.cfg.get("evaluation")}')
        print(f'checkpoint_path {checkpoint_path}')


__all__ = ['DummyTrainer']
