"""``mmcv.runner.checkpoint``: ``load_checkpoint`` and ``save_checkpoint``."""
from . import load_checkpoint, save_checkpoint  # noqa: F401
