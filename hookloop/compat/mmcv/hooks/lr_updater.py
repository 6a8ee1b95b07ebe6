"""``mmcv.runner.hooks.lr_updater``: the LR updater hooks and MMCV's annealing helpers."""
from ....hooks.lr_updater import *  # noqa: F401,F403
from ....hooks.lr_updater import LrUpdaterHook  # noqa: F401
from ....schedules import annealing_cos, annealing_linear  # noqa: F401
