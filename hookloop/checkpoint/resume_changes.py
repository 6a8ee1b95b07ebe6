"""What changed between the run that wrote a checkpoint and the run resuming from it.

The saved config (``meta['config']``) is compared with the current one and every
difference is logged in one block, each with the rule that applies (``docs/checkpoints.md``
has the table; each rule has a test in ``tests/test_resume_changes.py``):

* ``optimizer.<hyperparameter>`` and ``optimizer.paramwise_cfg``: the param groups are built
  again from the current config, as a fresh run builds them (multipliers, decay rules), and
  each group takes the new values; the groups that changed are listed. ``lr`` re-bases the
  schedule (``initial_lr``).
* ``lr_config`` / ``momentum_config``: the new schedule applies from the resumed iteration.
* ``max_epochs`` / ``max_iters``: the schedule is re-planned over the new length.
* ``*.save_best``: a new best record starts under the new metric; the old best file stays.
* ``seed``: the checkpoint's seed is kept (the data order and the RNG states continue).
* batch size, world size: the epoch continues from its record in the new shape
  (:mod:`hookloop.engine.elastic_resume`).
* ``hooks.<name>``: a hook added starts afresh, a hook removed leaves its state unused.
* anything else: the new value is used.

Besides the config (a config-built run's), every checkpoint records the run's settings, so a
run built in Python gets the same report (:mod:`hookloop.engine.resume_report`).

A change of the epoch's shape (batch size, world size) is followed by
:mod:`hookloop.engine.elastic_resume` where the loader allows it; otherwise a mid-epoch change is
refused (:func:`check_epoch_length`), and ``resume_policy='restart_epoch'`` continues from the
start of the next epoch instead.
"""
from collections.abc import Mapping

from ..errors import ConfigError

# Keys that say how this run starts, not what it trains.
NOT_COMPARED = {'resume_from', 'auto_resume', 'load_from', 'work_dir', 'cfg', 'resume_policy'}
RESUME_POLICIES = (None, 'restart_epoch')


def plain(value):
    """``value`` with everything that is not a plain container, number or string
    replaced by its repr, so it can live in a ``weights_only`` checkpoint."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):  # kept a tuple (MMCV's CLASSES): weights_only loads tuples
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


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


def rule_for(key, iteration, saved_seed=None):
    if key.startswith('optimizer.') and key not in ('optimizer.type', 'optimizer.constructor'):
        extra = ' (the schedule is re-based on it)' if key == 'optimizer.lr' else ''
        return (f'from iteration {iteration} each param group takes the value a fresh run builds from the '
                f'new config{extra}')
    if key.startswith(('lr_config', 'momentum_config')):
        return f'the new schedule applies from iteration {iteration}'
    if key in ('max_epochs', 'max_iters'):
        return 'the schedule is re-planned over the new length'
    if key.endswith('.save_best'):
        return 'a new best record starts under the new metric; the old best checkpoint file stays'
    if key == 'seed':
        kept = f' ({saved_seed})' if saved_seed is not None else ''
        return f"the checkpoint's seed{kept} is kept: the data order and the RNG states continue"
    if key in ('batch_size', 'world_size') or key.endswith('.batch_size'):
        return "the epoch continues from where the checkpoint's run was in it, in the new shape (the resume says where)"
    if key.startswith('hooks.'):
        return 'a hook the checkpoint holds no state of starts afresh; the state of a hook no longer registered is not used'
    return 'the new value is used'


def describe(changes, iteration, saved_seed=None):
    lines = [f'  {key}: {old!r} -> {new!r}: {rule_for(key, iteration, saved_seed)}' for key, old, new in changes]
    return 'the config differs from the checkpoint\'s:\n' + '\n'.join(lines)


def changed_hyperparameters(changes):
    """The param-group entries a config change touches: ``optimizer.<name>`` itself, and
    ``lr`` / ``weight_decay`` for a ``paramwise_cfg`` change (its multipliers)."""
    names = set()
    for key, _, _ in changes:
        if not key.startswith('optimizer.'):
            continue
        name = key[len('optimizer.'):]
        if name.startswith('paramwise_cfg'):
            names.update(('lr', 'weight_decay'))
        elif '.' not in name and name not in ('type', 'constructor'):
            names.add(name)
    return names


def apply_optimizer_changes(optimizer, changes, fresh_groups, set_value):
    """After ``optimizer.load_state_dict``: the hyperparameters the current config changed
    (the loaded state brought the old ones) are set group by group to what a fresh run's
    construction gives (``fresh_groups()``: those groups, or None when the optimizer was
    passed built: then the new value is set on every group), each with
    ``set_value(group, name, value)`` (the trainer passes ``optim.param_groups.set_value``,
    the groups' one writer). Returns the log lines."""
    names = changed_hyperparameters(changes)
    if not names:
        return []
    fresh = fresh_groups()
    groups = optimizer.param_groups
    if fresh is None:
        new = {key[len('optimizer.'):]: value for key, _, value in changes}
        fresh = [{name: new[name] for name in names if name in new and new[name] != '<absent>'} for _ in groups]
        how = 'the optimizer was passed built, so each group takes the config\'s value'
    else:
        how = 'as a fresh run builds them'
    if len(fresh) != len(groups):
        raise ConfigError(f'the optimizer config now builds {len(fresh)} param groups, the checkpoint has '
                          f'{len(groups)}: its state cannot be carried over')
    lines = []
    for index, (group, new_group) in enumerate(zip(groups, fresh)):
        done = []
        for name in sorted(names):
            if name not in new_group or name not in group:
                continue
            value = new_group[name]
            value = tuple(value) if isinstance(group[name], tuple) else value
            initial = f'initial_{name}'
            old = group.get(initial, group[name])
            if old == value:
                continue
            set_value(group, name, value)
            if initial in group or name == 'lr':
                set_value(group, initial, value)
            done.append(f'{name} {_shown(old)} -> {_shown(value)}')
        if done:
            lines.append(f'  param group {index}: ' + ', '.join(done))
    if not lines:
        return [f'optimizer hyper-parameters {sorted(names)}: no param group changes ({how})']
    return [f'optimizer param groups set from the new config ({how}):\n' + '\n'.join(lines)]


def _shown(value):
    return f'{value:.6g}' if isinstance(value, float) else repr(value)


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
