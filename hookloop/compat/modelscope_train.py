"""The ``train`` section of a ModelScope configuration (and ``evaluation.period``) as
hookloop hook configs, with ModelScope's default hooks.

ModelScope adds ``CheckpointHook(interval=1)``, ``TextLoggerHook(interval=10)`` and
``IterTimerHook`` to every configuration (a hook of that type in ``train.hooks`` keeps its
own values; missing ones come from the default), and reads the current sections
``train.checkpoint.period`` (CheckpointHook), ``train.checkpoint.best`` (BestCkptSaverHook),
``train.logging`` (TextLoggerHook) and ``evaluation.period`` (EvaluationHook), whose values
win over those of the same hook in ``train.hooks``.
"""
import os

from ..errors import ConfigError

DEFAULT_HOOKS = (('CheckpointHook', {'interval': 1}), ('TextLoggerHook', {'interval': 10}), ('IterTimerHook', {}))
SECTIONS = (('TextLoggerHook', ('train', 'logging')), ('CheckpointHook', ('train', 'checkpoint', 'period')),
            ('BestCkptSaverHook', ('train', 'checkpoint', 'best')), ('EvaluationHook', ('evaluation', 'period')))
_HUB_KEYS = ('push_to_hub', 'hub_repo_id', 'hub_token', 'private_hub', 'hub_revision', 'upload_strategy')


def _section(ms, chain):
    value = ms
    for key in chain:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _pop_section(ms, chain):
    """Remove a consumed section (and ``train.checkpoint`` once it is empty)."""
    parent = _section(ms, chain[:-1])
    if isinstance(parent, dict):
        parent.pop(chain[-1], None)
        if chain[:2] == ('train', 'checkpoint') and not parent:
            ms['train'].pop('checkpoint', None)


def follow_work_dir(ms):
    """A work dir given to the trainer (``work_dir=`` / ``--work-dir``) replaces the
    directories the file names for checkpoints and logs, as ModelScope does."""
    train = ms.get('train') or {}
    hooks = [h for h in train.get('hooks') or [] if isinstance(h, dict)]
    for kind, chain in SECTIONS[:3]:
        section = _section(ms, chain)
        key = 'out_dir' if kind == 'TextLoggerHook' else 'save_dir'
        for hook in [h for h in hooks if h.get('type') == kind] + ([section] if isinstance(section, dict) else []):
            hook.pop(key, None)


def merged_hooks(ms, problems):
    """``train.hooks`` with ModelScope's defaults and the current sections folded in."""
    hooks = []
    for hook in (ms.get('train') or {}).get('hooks') or []:
        if not isinstance(hook, dict) or 'type' not in hook:
            problems.append(f'train.hooks entries must be dicts with a "type", got {hook!r}')
            continue
        hooks.append(dict(hook))
    by_type = {}
    for hook in hooks:
        by_type.setdefault(hook['type'], hook)
    for kind, values in DEFAULT_HOOKS:
        if kind in by_type:
            for key, value in values.items():
                by_type[kind].setdefault(key, value)
        else:
            by_type[kind] = dict(type=kind, **values)
            hooks.append(by_type[kind])
    for hook in [h for h in hooks if h['type'] == 'EvaluationHook' and 'save_best_ckpt' in h]:
        _best_from_evaluation_hook(hook, by_type, hooks)
    for kind, chain in SECTIONS:
        section = _section(ms, chain)
        if section is None:
            continue
        if not isinstance(section, dict):
            problems.append(f'{".".join(chain)} must be a dict, got {section!r}')
            continue
        _pop_section(ms, chain)
        if kind in by_type:
            by_type[kind].update(section)
        else:
            by_type[kind] = dict(type=kind, **section)
            hooks.append(by_type[kind])
    return hooks


def _best_from_evaluation_hook(hook, by_type, hooks):
    """ModelScope's older ``EvaluationHook(save_best_ckpt=True, monitor_key=..., rule=..., out_dir=...)``
    keeps the best checkpoint itself; it is the ``BestCkptSaverHook`` of the same values."""
    save = hook.pop('save_best_ckpt')
    best = {'metric_key': hook.pop('monitor_key', None), 'rule': hook.pop('rule', 'max')}
    if hook.get('out_dir') is not None:
        best['save_dir'] = hook.pop('out_dir')
    hook.pop('out_dir', None)
    if not save or 'BestCkptSaverHook' in by_type:
        return
    by_type['BestCkptSaverHook'] = dict(type='BestCkptSaverHook', **{k: v for k, v in best.items() if v is not None})
    hooks.append(by_type['BestCkptSaverHook'])


def _by_epoch(hook, default=True):
    strategy = hook.pop('save_strategy', None)
    by_epoch = hook.pop('by_epoch', None)
    if by_epoch is not None:
        return bool(by_epoch)
    if strategy is None:
        return default
    if strategy not in ('by_epoch', 'by_step', 'no'):
        raise ConfigError(f"ModelScope CheckpointHook save_strategy must be 'by_epoch', 'by_step' or 'no', "
                          f'got {strategy!r}')
    return {'by_epoch': True, 'by_step': False, 'no': None}[strategy]


def _output_dir(hook, default, save_dir=None):
    """ModelScope's inference folder: ``output_dir``, else ``<save_dir>/<output_sub_dir or default>``."""
    sub = hook.pop('output_sub_dir', None)
    out = hook.pop('output_dir', None)
    if out is not None:
        return out
    sub = sub if sub is not None else default
    return os.path.join(save_dir, sub) if save_dir else sub


def _refuse_hub(hook, kind, problems):
    if hook.get('push_to_hub'):
        problems.append(f'{kind} push_to_hub (hookloop does not upload to the ModelScope hub)')
    for key in _HUB_KEYS:
        hook.pop(key, None)


def checkpoint_args(hooks, problems):
    """One ModelScopeCheckpointHook config from ModelScope's CheckpointHook and BestCkptSaverHook."""
    out = {}
    period = next((h for h in hooks if h['type'] == 'CheckpointHook'), None)
    best = next((h for h in hooks if h['type'] == 'BestCkptSaverHook'), None)
    if period is not None:
        hook = {k: v for k, v in period.items() if k != 'type'}
        _refuse_hub(hook, 'CheckpointHook', problems)
        by_epoch = _by_epoch(hook)
        interval = hook.pop('interval', 0)
        save_last = hook.pop('save_last', True)
        if by_epoch is None:  # save_strategy='no'
            interval, save_last, by_epoch = -1, False, True
        out.update(interval=-1 if interval == 0 else interval, by_epoch=by_epoch, save_last=save_last)
        save_dir = hook.pop('save_dir', None)
        if save_dir is not None:
            out['out_dir'] = save_dir
        out['output_dir'] = _output_dir(hook, 'output', save_dir)
        if hook.get('max_checkpoint_num') is not None:
            out['max_keep_ckpts'] = max(int(hook.pop('max_checkpoint_num')), 1)
        hook.pop('max_checkpoint_num', None)
        if 'save_trainer_state' in hook:
            out['save_optimizer'] = bool(hook.pop('save_trainer_state'))
        if hook:
            problems.append(f'CheckpointHook got arguments hookloop does not know: {sorted(hook)}')
    else:
        out.update(interval=-1, save_last=False)
    if best is not None:
        hook = {k: v for k, v in best.items() if k != 'type'}
        _refuse_hub(hook, 'BestCkptSaverHook', problems)
        for key in ('interval', 'save_strategy', 'by_epoch', 'save_trainer_state'):
            hook.pop(key, None)  # ModelScope ignores them: the best follows the evaluation
        best_dir = hook.pop('save_dir', None)
        if best_dir is not None and best_dir != out.get('out_dir'):
            out['best_dir'] = best_dir  # the best checkpoint goes there, the interval ones stay where they are
        if 'metric_key' not in hook:
            problems.append('BestCkptSaverHook needs a metric_key')
        if hook.pop('restore_best', False):
            problems.append('BestCkptSaverHook restore_best=True (load the best file with trainer.load_weights)')
        if hook.get('max_checkpoint_num', 1) not in (None, 1):
            problems.append(f'BestCkptSaverHook max_checkpoint_num={hook["max_checkpoint_num"]!r} '
                            '(hookloop keeps one best checkpoint)')
        hook.pop('max_checkpoint_num', None)
        rule = hook.pop('rule', 'max')
        if rule not in ('max', 'min'):
            problems.append(f"BestCkptSaverHook rule must be 'max' or 'min', got {rule!r}")
        if hook.pop('save_best', True) and 'metric_key' in hook:
            out.update(save_best=hook.pop('metric_key'), rule={'max': 'greater', 'min': 'less'}.get(rule))
        hook.pop('metric_key', None)
        out['best_output_dir'] = _output_dir(hook, 'output_best', best_dir)
        if hook.get('save_file_name') is not None:
            out['save_file_name'] = hook.pop('save_file_name')
        hook.pop('save_file_name', None)
        if hook:
            problems.append(f'BestCkptSaverHook got arguments hookloop does not know: {sorted(hook)}')
    return out


def logger_hook(kind, hook):
    hook = dict(hook)
    hook.pop('reset_flag', None)  # hookloop's meters are per logger interval already
    if kind == 'TensorboardHook':
        if 'out_dir' in hook:
            hook['log_dir'] = hook.pop('out_dir')
        return dict(type='ModelScopeTensorboardHook', **hook)
    return dict(type='ModelScopeTextLoggerHook', **hook)


def evaluation_hook(hook):
    hook = dict(hook)
    if 'start_idx' in hook:
        hook['start'] = hook.pop('start_idx')
    return hook


__all__ = ['follow_work_dir', 'merged_hooks', 'checkpoint_args', 'logger_hook', 'evaluation_hook']
