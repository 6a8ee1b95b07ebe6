"""The optimizer step: backward, step and zero_grad, done by a swappable processor."""

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


def total_loss(outputs, loss_keys):
    """The sum of ``outputs[k]`` for ``k`` in ``loss_keys``; ConfigError naming the keys found."""
    try:
        losses = [outputs[key] for key in loss_keys]
    except KeyError as exc:
        raise ConfigError(f'loss key {exc.args[0]!r} is not in the model outputs {list(outputs.keys())}; '
                          'set loss_keys to the keys to back-propagate') from None
    loss = losses[0]
    for extra in losses[1:]:
        loss = loss + extra
    return loss


class OptimizerProcessor:
    """Does backward and the optimizer step. Swap it with ``OptimizerHook.set_processor``
    to change how a step is made without copying the hook."""

    def initialize_optimizer(self, trainer):
        trainer.optimizer.zero_grad(set_to_none=True)

    def before_forward(self, trainer):
        pass

    def backward(self, trainer, loss_keys, cumulative_iters, grad_clip):
        total_loss(trainer.outputs, loss_keys).backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)


@HOOKS.register_module()
class OptimizerHook(Hook):
    """Back-propagates ``loss_keys`` of the step's outputs and steps the optimizer.

    Only one optimizer-stepping hook may be registered (role ``'optimizer'``).
    """

    PRIORITY = Priority.ABOVE_NORMAL
    ROLE = 'optimizer'
    EXCLUSIVE = True

    def __init__(self, grad_clip=None, cumulative_iters=1, loss_keys='loss'):
        if isinstance(loss_keys, str):
            loss_keys = [loss_keys]
        if not isinstance(loss_keys, (list, tuple)) or not loss_keys or \
                not all(isinstance(k, str) for k in loss_keys):
            raise ConfigError(f'OptimizerHook loss_keys must be a key or a list of keys, got {loss_keys!r}')
        self.loss_keys = list(loss_keys)
        self.cumulative_iters = cumulative_iters
        self.grad_clip = grad_clip
        self.processor = OptimizerProcessor()

    def set_processor(self, processor):
        self.processor = processor

    def before_run(self, trainer):
        self.processor.initialize_optimizer(trainer)

    def before_train_iter(self, trainer):
        self.processor.before_forward(trainer)

    def after_train_iter(self, trainer):
        self.processor.backward(trainer, self.loss_keys, self.cumulative_iters, self.grad_clip)


__all__ = ['OptimizerHook', 'OptimizerProcessor', 'total_loss']
