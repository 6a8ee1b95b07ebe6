"""Checks that a checkpoint's optimizer state fits this run's optimizer, before it is loaded.

``Optimizer.load_state_dict`` replaces the param groups' hyperparameters with the saved ones
without asking whose they are: an Adam checkpoint resumed into an SGD run loads, then fails
at the first step (``KeyError: 'momentum'``). Here the saved groups must name the same
hyperparameters as this optimizer's (keys that only one side has, on *both* sides, mean
another optimizer class; keys that a newer torch added are filled in by torch itself).
"""
import re

import torch

from ..errors import CheckpointError
from ..fileio import storage

_NAMED = re.compile(r'(?:^|_)(iter|epoch)_(\d+)(?:\.pth)?$')


def named_position(path):
    """``('iter' | 'epoch', n)`` that a checkpoint's name says it holds (``iter_15.pth``,
    ``best_acc_epoch_3.pth``, ``preempt_iter_17.pth``); None when its name says nothing."""
    found = _NAMED.search(storage.basename(path))
    return (found.group(1), int(found.group(2))) if found else None


def position_disagreement(path, meta):
    """One line when ``meta`` (a checkpoint's counters) is not the position its name says
    (two checkpoints swapped or renamed: each verifies, as its sidecar moved with it); None when
    they agree or the name says nothing."""
    named = named_position(path)
    if named is None or meta.get(named[0]) == named[1]:
        return None
    return (f'{storage.basename(path)} holds the state after {meta.get("iter")} iterations (epoch {meta.get("epoch")}), '
            f'not after {named[0]} {named[1]} as its name says (renamed, or swapped with another checkpoint?); '
            'continuing from what it holds')


def check_optimizer_fits(optimizer, saved, path):
    """CheckpointError naming ``path`` when ``saved`` (an optimizer ``state_dict``) was written
    by another kind of optimizer than ``optimizer``."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(saved, dict):
        return
    groups = saved.get('param_groups')
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        raise CheckpointError(f'{path!r}: its optimizer state has no param groups (damaged or not an optimizer state)')
    current = set(optimizer.param_groups[0]) - {'params'}
    for group in groups:
        keys = set(group) - {'params', 'initial_lr'}
        only_saved, only_here = keys - current, current - keys - {'initial_lr'}
        if only_saved and only_here:
            raise CheckpointError(
                f'{path!r} holds the state of another kind of optimizer than this run\'s '
                f'{type(optimizer).__name__}: it has {sorted(only_saved)[:4]}, this optimizer needs '
                f'{sorted(only_here)[:4]}; resume with the optimizer it was saved with, or start from its weights '
                'with load_from')
