"""``mmcv.runner.hooks.evaluation``: ``EvalHook`` and ``DistEvalHook``."""
from ..eval_hook import DistEvalHook, EvalHook  # noqa: F401
