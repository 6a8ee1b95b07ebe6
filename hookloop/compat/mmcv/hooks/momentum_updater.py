"""``mmcv.runner.hooks.momentum_updater``: the momentum updater hooks (MMCV's exception types)."""
from .. import SCHEDULE_HOOKS

globals().update({name: cls for name, cls in SCHEDULE_HOOKS.items() if name.endswith('MomentumUpdaterHook')})
