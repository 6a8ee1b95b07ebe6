"""``mmcv.runner.hooks.evaluation``: ``EvalHook`` and ``DistEvalHook``."""
from .. import DistEvalHook, EvalHook  # noqa: F401
