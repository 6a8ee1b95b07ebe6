"""The change report of every resume: what changed since the checkpoint, and what was kept.

Every checkpoint records the run's settings (``meta['settings']``: the run's length, batch size,
world size, seed, the optimizer's class and hyper-parameters, the hooks by name), whether the
trainer was built from a config or in Python; a config-built one also stores its config
(``meta['config']``). A resume compares both with the current run and logs one block: each
difference with the rule that applies (:func:`hookloop.checkpoint.resume_changes.rule_for`), then
what is kept. So a Python-API resume with ``max_epochs`` 4 -> 6 or another batch size says so as a
config resume does, and the optimizer's changed hyper-parameters are applied the same way.
"""
from collections.abc import Mapping

import torch

from ..checkpoint.resume_changes import config_differences, describe, plain


# torch.optim flags that choose an implementation, not what is trained
_IMPLEMENTATION_FLAGS = frozenset(('foreach', 'fused', 'capturable', 'differentiable', 'maximize'))


def run_settings(trainer):
    """What a checkpoint records of the run's settings, as plain values."""
    settings = {'max_epochs': trainer.max_epochs} if trainer.by_epoch else {'max_iters': trainer.max_iters}
    loader = trainer.train_dataloader
    batch_size = getattr(getattr(loader, 'batch_sampler', None), 'batch_size', None) or getattr(loader, 'batch_size', None)
    if isinstance(batch_size, int):
        settings['batch_size'] = batch_size
    settings.update(world_size=trainer.world_size, seed=trainer.seed)
    optimizer = trainer.optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        hyper = {key: plain(value) for key, value in optimizer.defaults.items()
                 if _plain(value) and key not in _IMPLEMENTATION_FLAGS}
        settings['optimizer'] = {'type': type(optimizer).__name__, **hyper}
    settings['hooks'] = {hook.name: type(hook).__name__ for hook in trainer.hooks}
    return settings


def _plain(value):
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, (bool, int, float, str))


def resume_changes(trainer, meta, iteration, path):
    """``[(dotted key, saved, current)]``: how this run differs from the checkpoint's (``meta``),
    its settings and, when both have one, its config; logged in one block with what is kept
    (a warning when something changed)."""
    saved, current = meta.get('settings'), run_settings(trainer)
    changes = config_differences(saved, current) if isinstance(saved, Mapping) else []
    saved_cfg, current_cfg = meta.get('config'), plain(trainer.cfg) if trainer.cfg is not None else None
    if isinstance(saved_cfg, Mapping) and isinstance(current_cfg, Mapping):
        in_config = config_differences(saved_cfg, current_cfg)
        # a setting the config names too (max_epochs, optimizer.lr, train_dataloader.batch_size) is said once
        changes = in_config + [c for c in changes if not any(k == c[0] or k.endswith('.' + c[0]) for k, _, _ in in_config)]
    kept = _kept(saved, current, {key for key, _, _ in changes}) if isinstance(saved, Mapping) else ''
    if changes:
        trainer.logger.warning('%s%s', describe(changes, iteration, meta.get('seed')), kept and f'\n  kept: {kept}')
    elif kept:
        trainer.logger.info('resuming %s: the settings are the checkpoint\'s (%s)', path, kept)
    return changes


def _kept(saved, current, changed):
    """``max_epochs 3, batch_size 8, ..., optimizer SGD(lr=0.1, momentum=0.9)``: the settings the
    resume keeps (the hooks left out: one line)."""
    parts = []
    for key, value in current.items():
        if key == 'hooks' or key not in saved:
            continue
        if isinstance(value, Mapping):
            same = {k: v for k, v in value.items() if f'{key}.{k}' not in changed and k != 'type'}
            kind = value.get('type', '') if f'{key}.type' not in changed else ''
            parts.append(f'{key} {kind}(' + ', '.join(f'{k}={v!r}' for k, v in same.items()) + ')')
        elif key not in changed:
            parts.append(f'{key} {value!r}')
    return ', '.join(parts)


__all__ = ['resume_changes', 'run_settings']
