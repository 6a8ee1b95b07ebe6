"""``mmcv.runner.hooks.lr_updater``: the LR updater hooks (with MMCV's argument
exception types, see :func:`hookloop.compat.mmcv.mmcv_asserting`) and MMCV's annealing helpers."""
from .. import _schedule_hooks
from ....schedules import annealing_cos, annealing_linear  # noqa: F401

globals().update({name: cls for name, cls in _schedule_hooks().items() if name.endswith('LrUpdaterHook')})
