"""``mmcv.runner.hooks.momentum_updater``: the momentum updater hooks (MMCV's exception types)."""
from .. import _schedule_hooks

globals().update({name: cls for name, cls in _schedule_hooks().items() if name.endswith('MomentumUpdaterHook')})
