"""``mmcv.runner.hooks.lr_updater``: the LR updater hooks (with MMCV's argument
exception types, see :func:`hookloop.compat.mmcv.mmcv_asserting`) and MMCV's annealing helpers."""
from .. import SCHEDULE_HOOKS
from ....optim.schedules import annealing_cos, annealing_linear  # noqa: F401

globals().update({name: cls for name, cls in SCHEDULE_HOOKS.items() if name.endswith('LrUpdaterHook')})
