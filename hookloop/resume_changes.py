"""What changed between the run that wrote a checkpoint and the run resuming from it.

The saved config (``meta['config']``) is compared with the current one and every
difference is logged in one block, each with the rule that applies:

* ``optimizer.<hyperparameter>`` (``lr``, ``weight_decay``, ...): the new value wins from
  the resumed iteration; for ``lr`` the schedule is re-based on it (``initial_lr``).
* ``lr_config`` / ``momentum_config``: the new schedule applies from the resumed iteration.
* ``max_epochs`` / ``max_iters``: the schedule is re-planned over the new length.
* anything else: the new value is used.

A change of the number of batches per epoch (batch size, world size, dataset size) in the
middle of an epoch is refused: the sampler position would no longer name the same samples.
``resume_policy='restart_epoch'`` continues from the start of the next epoch instead.
"""
from collections.abc import Mapping

from .errors import ConfigError

# Keys that say how this run starts, not what it trains.
NOT_COMPARED = {'resume_from', 'auto_resume', 'load_from', 'work_dir', 'cfg', 'resume_policy'}
RESUME_POLICIES = (None, 'restart_epoch')


def config_differences(saved, current, prefix=''):
    """``[(dotted key, saved value, current value)]`` between two plain config dicts."""
    changes = []
    for key in sorted(set(saved) | set(current), key=str):
        if not prefix and key in NOT_COMPARED:
            continue
        old, new = saved.get(key, '<absent>'), current.get(key, '<absent>')
        name = f'{prefix}{key}'
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changes += config_differences(old, new, name + '.')
        elif old != new:
            changes.append((name, old, new))
    return changes


def rule_for(key, iteration):
    if key.startswith('optimizer.') and key.count('.') == 1 and key != 'optimizer.type':
        extra = ' (the schedule is re-based on it)' if key == 'optimizer.lr' else ''
        return f'the new value is used from iteration {iteration}{extra}'
    if key.startswith(('lr_config', 'momentum_config')):
        return f'the new schedule applies from iteration {iteration}'
    if key in ('max_epochs', 'max_iters'):
        return 'the schedule is re-planned over the new length'
    return 'the new value is used'


def describe(changes, iteration):
    lines = [f'  {key}: {old!r} -> {new!r}: {rule_for(key, iteration)}' for key, old, new in changes]
    return 'the config differs from the checkpoint\'s:\n' + '\n'.join(lines)


def apply_optimizer_changes(optimizer, changes):
    """After ``optimizer.load_state_dict``: put back the hyperparameters the current config
    changed (the loaded state brought the old ones)."""
    for key, _, new in changes:
        name = key[len('optimizer.'):] if key.startswith('optimizer.') else None
        if name is None or '.' in name or name == 'type' or new == '<absent>':
            continue
        for group in optimizer.param_groups:
            if name in group:
                group[name] = tuple(new) if isinstance(group[name], tuple) else new
                if name == 'lr':
                    group['initial_lr'] = new


def check_epoch_length(meta, iters_per_epoch, world_size, policy, path):
    """Refuse (or, with ``restart_epoch``, plan) a resume whose epoch length changed
    mid-epoch. Returns ``(epoch, iter, inner_iter)`` to continue from, or None to keep
    the checkpoint's."""
    saved = meta.get('iters_per_epoch')
    if saved is None or saved == iters_per_epoch or meta.get('inner_iter', 0) == 0:
        return None
    what = (f'batches per epoch changed from {saved} to {iters_per_epoch} (batch size, world size '
            f'{meta.get("world_size", "?")} -> {world_size}, or dataset size)')
    if policy != 'restart_epoch':
        raise ConfigError(f'cannot resume {path!r} mid-epoch (batch {meta["inner_iter"]} of epoch '
                          f'{meta["epoch"] + 1}): {what}, so its position no longer names the same samples; '
                          "resume from an epoch-boundary checkpoint, or set resume_policy='restart_epoch' to "
                          'continue from the start of the next epoch')
    epoch = meta['epoch'] + 1
    return epoch, epoch * iters_per_epoch, 0
