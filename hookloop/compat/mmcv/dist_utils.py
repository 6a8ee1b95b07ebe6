"""``mmcv.runner.dist_utils``."""
from . import get_dist_info, init_dist, master_only  # noqa: F401
