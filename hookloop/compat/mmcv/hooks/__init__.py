"""``mmcv.runner.hooks``: the hooks of :mod:`hookloop.compat.mmcv`."""
from .. import *  # noqa: F401,F403 (the same names as mmcv.runner)
from .. import __all__  # noqa: F401
