"""``mmcv.parallel.registry``: ``MODULE_WRAPPERS``, the classes whose ``.module`` is the model."""
from torch.nn.parallel import DataParallel, DistributedDataParallel

from ....registry import Registry

MODULE_WRAPPERS = Registry('module wrapper')
MODULE_WRAPPERS.register_module(module=DataParallel)
MODULE_WRAPPERS.register_module(module=DistributedDataParallel)

__all__ = ['MODULE_WRAPPERS']
