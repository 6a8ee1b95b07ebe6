"""``mmcv.parallel``: MMCV's model wrappers, as wrappers.

``MMDataParallel(model)`` and ``MMDistributedDataParallel(model)`` give an object whose
``.module`` is the model, as MMCV's do, so the hooks OpenMMLab repositories ship
(``runner.model.module.backbone``, ``runner.model.module.momentum``) find what they reach for.
On one device they add nothing else: ``forward``, ``train_step`` and ``val_step`` are the
model's, and the batch is not scattered (the trainer moves it to the model's device).
``MMDistributedDataParallel`` does not reduce gradients itself: under torchrun the trainer
wraps the model in torch's DDP (its ``find_unused_parameters`` is passed on by the runners).

A wrapper is transparent to the trainer: its parameters, buffers and state dict carry the
model's own names (MMCV saves checkpoints of ``model.module`` too), so a checkpoint written
with a wrapper loads into the bare model and back.
"""
from torch import nn

from .registry import MODULE_WRAPPERS


class _ModuleWrapper(nn.Module):
    """The model as ``self.module``, with the model's names and calls."""

    # hookloop.engine.model_step.accepts_return_loss looks through a wrapper that declares this
    passes_arguments_to_module = True

    def __init__(self, module, device_ids=None, dim=0, **kwargs):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f'{type(self).__name__} wraps an nn.Module, got {type(module).__name__}')
        self.module = module
        self.device_ids, self.dim = device_ids, dim

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    # MMCV's wrappers always have train_step / val_step; here they exist exactly when the model
    # has them, so the trainer tells a train_step model from a plain one through the wrapper.
    @property
    def train_step(self):
        return self.module.train_step

    @property
    def val_step(self):
        return self.module.val_step

    # -- the model's names: state dict, modules, parameters, buffers --------------------------
    def state_dict(self, *args, destination=None, prefix='', keep_vars=False):
        return self.module.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_modules(self, memo=None, prefix='', remove_duplicate=True):
        # named_parameters / named_buffers / modules() walk this: without the wrapper's own level
        yield from self.module.named_modules(memo, prefix, remove_duplicate)


class MMDataParallel(_ModuleWrapper):
    """MMCV's ``MMDataParallel(module, device_ids=None, dim=0)`` on one device."""


class MMDistributedDataParallel(_ModuleWrapper):
    """MMCV's ``MMDistributedDataParallel(module, device_ids=None, broadcast_buffers=False,
    find_unused_parameters=False)``; the runners hand ``find_unused_parameters`` to the
    trainer's DDP under torchrun."""

    def __init__(self, module, device_ids=None, dim=0, broadcast_buffers=False, find_unused_parameters=False,
                 **kwargs):
        super().__init__(module, device_ids, dim)
        self.broadcast_buffers, self.find_unused_parameters = broadcast_buffers, find_unused_parameters


MODULE_WRAPPERS.register_module(module=MMDataParallel)
MODULE_WRAPPERS.register_module(module=MMDistributedDataParallel)


def build_wrapped_model(cfg):
    """``MMDataParallel`` around the model ``cfg`` describes (an MMCV config's ``model``)."""
    from ....engine.builder import build_model
    return MMDataParallel(build_model(cfg))


def is_module_wrapper(module):
    """True for an instance of a class in ``MODULE_WRAPPERS`` (DataParallel, DDP, the MM
    wrappers, and what user code registers there)."""
    return isinstance(module, tuple(MODULE_WRAPPERS.module_dict.values()))


__all__ = ['MMDataParallel', 'MMDistributedDataParallel', 'MODULE_WRAPPERS', 'build_wrapped_model', 'is_module_wrapper']
