"""MMCV's ``OptimizerHook.after_train_iter(runner)`` for code that drives an optimizer hook
itself: called on a runner that is not a hookloop trainer (a repository's own runner loop, a
test's mock), the façade's optimizer hooks make MMCV's step there: ``zero_grad``, the optional
report of parameters outside the loss's graph (``detect_anomalous_params``, logged at ERROR
on ``runner.logger`` as MMCV does), ``backward``, the optional clipping (its norm into
``runner.log_buffer``), ``step``. In a hookloop run the trainer drives them as always."""
import logging

import torch

from ...engine.trainer import Trainer


def parameters_outside_graph(loss, model):
    """The names of ``model``'s trainable parameters the autograd graph of ``loss`` does not reach."""
    reached, seen, pending = set(), set(), [loss.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, 'variable'):
            reached.add(node.variable)
        pending.extend(parent for parent, _ in node.next_functions)
    return [name for name, p in model.named_parameters() if p.requires_grad and p not in reached]


def mmcv_optimizer_step(hook, runner):
    """MMCV 1.7's step of ``hook`` (an OptimizerHook) on ``runner``."""
    runner.optimizer.zero_grad()
    loss = runner.outputs['loss']
    if hook.processor.detect_anomalous_params:
        parameters = dict(runner.model.named_parameters())
        for name in parameters_outside_graph(loss, runner.model):
            runner.logger.log(level=logging.ERROR,
                              msg=f'{name} with shape {parameters[name].size()} is not in the computational graph \n')
    loss.backward()
    if hook.grad_clip is not None:
        params = [p for p in runner.model.parameters() if p.requires_grad and p.grad is not None]
        if 'clip_value' in hook.grad_clip:
            torch.nn.utils.clip_grad_value_(params, hook.grad_clip['clip_value'])
        elif params:
            norm = torch.nn.utils.clip_grad_norm_(params, **hook.grad_clip)
            runner.log_buffer.update({'grad_norm': float(norm)}, runner.outputs['num_samples'])
    runner.optimizer.step()


class DrivenByMMCVCode:
    """Mixin of the façade's optimizer hooks: :func:`mmcv_optimizer_step` when the runner is
    not a hookloop trainer."""

    def after_train_iter(self, runner):
        if isinstance(runner, Trainer):
            return super().after_train_iter(runner)
        return mmcv_optimizer_step(self, runner)


__all__ = ['DrivenByMMCVCode', 'mmcv_optimizer_step', 'parameters_outside_graph']
