"""``mmcv.runner.hooks.hook``: ``HOOKS`` and ``Hook``."""
from ....hooks import Hook
from ....registry import HOOKS

__all__ = ['HOOKS', 'Hook']
