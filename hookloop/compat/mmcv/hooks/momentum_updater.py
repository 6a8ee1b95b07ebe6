"""``mmcv.runner.hooks.momentum_updater``: the momentum updater hooks."""
from ....hooks.momentum_updater import *  # noqa: F401,F403
from ....hooks.momentum_updater import MomentumUpdaterHook  # noqa: F401
