"""The hooks of a trainer: registration, MMCV's config shapes, defaults and the stage table.

Kept apart from the trainer so that ``hookloop hooks CONFIG`` can show the run order of a
config without building a model, data or a work dir.
"""
import inspect
from collections.abc import Mapping

from ..errors import ConfigError
from ..hooks.base import Hook
from ..hooks.order import format_stage_table, role_of, sort_by_priority, stage_table, warn_contradictions
from ..priority import Priority, get_priority
from ..registry import HOOKS, closest_names


def _accepts(target, argument):
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return argument in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def hook_cfg(cfg, default_type):
    """A Hook as is, or a config dict with ``type`` defaulting to ``default_type``."""
    if isinstance(cfg, Hook):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ConfigError(f'a {default_type} config must be a dict, got {cfg!r}')
    cfg = dict(cfg)
    cfg.setdefault('type', default_type)
    return cfg


def policy_hook_cfg(cfg, suffix):
    """``dict(policy='Step', ...)`` -> ``dict(type='StepLrUpdaterHook', ...)``."""
    if isinstance(cfg, Hook):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ConfigError(f'{suffix} config must be a dict like dict(policy=...), got {cfg!r}')
    if 'type' in cfg:
        return cfg
    cfg = dict(cfg)
    if 'policy' not in cfg:
        raise ConfigError(f'{suffix} config needs a "policy" (or a "type"), got {cfg!r}')
    policy = cfg.pop('policy')
    if not isinstance(policy, str):
        cfg['type'] = policy
        return cfg
    name = policy + suffix
    if name not in HOOKS:  # accept any capitalisation ('step', 'cosineannealing', ...)
        by_lower = {key.lower(): key for key in HOOKS.keys() if key.endswith(suffix)}
        if name.lower() not in by_lower:
            known = sorted(key[:-len(suffix)] for key in by_lower.values())
            hint = closest_names(policy, known)
            raise ConfigError(f'unknown {suffix[:-len("UpdaterHook")].lower() or suffix} policy {policy!r}'
                              f'{"; closest: " + ", ".join(hint) if hint else ""}; known policies: '
                              f'{", ".join(known) or "none registered"}')
        name = by_lower[name.lower()]
    cfg['type'] = name
    return cfg


class HookList:
    """Registered hooks with their priorities; builds the per-stage run order.

    ``frozen`` (a reason string, set by the trainer while ``train()`` runs) refuses new
    registrations: the hooks of a run are fixed when it starts.
    """

    def __init__(self):
        self._entries = []  # (priority, registration index, hook, priority set by the user)
        self._defaults = set()  # ids of hooks that stand in for an empty role
        self._table = None
        self.frozen = None
        self._log_interval = 10  # log_config's interval: the default WorkDirLockHook checks at the log events

    @property
    def hooks(self):
        """The registered hooks, by priority (ties in registration order)."""
        return sort_by_priority([entry[:3] for entry in self._entries])

    def priority_of(self, hook):
        return next(value for value, _, other, _ in self._entries if other is hook)

    def register(self, hook, priority=None):
        """Register a Hook or a config dict (which may carry a ``priority`` key); see
        :meth:`hookloop.Trainer.register_hook`."""
        if isinstance(hook, Mapping):
            cfg = dict(hook)
            cfg_priority = cfg.pop('priority', None)
            hook = HOOKS.build(cfg)
            priority = cfg_priority if priority is None else priority
        if not isinstance(hook, Hook):
            raise ConfigError(f'a hook must be a hookloop.Hook or a config dict, got {type(hook).__name__}')
        if self.frozen:
            raise ConfigError(f'cannot register {type(hook).__name__} {self.frozen}: the hooks of a run are fixed '
                              'when it starts; register it before train(), or after train() returns')
        default = get_priority(getattr(hook, 'PRIORITY', Priority.NORMAL))
        value = default if priority is None else get_priority(priority)
        replaced = [entry for entry in self._entries
                    if id(entry[2]) in self._defaults and role_of(entry[2]) == role_of(hook)]
        for entry in replaced:
            self._entries.remove(entry)
            self._defaults.discard(id(entry[2]))
        for _, _, other, _ in self._entries:
            if other is hook:
                raise ConfigError(f'{hook.name} is already registered')
            if getattr(hook, 'EXCLUSIVE', False) and role_of(other) == role_of(hook):
                raise ConfigError(f'cannot register {type(hook).__name__}: {type(other).__name__} is already '
                                  f'registered for the "{role_of(hook)}" role and only one hook may fill it '
                                  '(configure that one hook instead, e.g. optimizer_config=dict(...))')
        names = {other.name for _, _, other, _ in self._entries}
        if hook.name in names:
            n = 1
            while f'{hook.name}_{n}' in names:
                n += 1
            hook.name = f'{hook.name}_{n}'
        user_set = value != default
        warn_contradictions(hook, value, user_set, self._entries)
        self._entries.append((value, len(self._entries), hook, user_set))
        self._table = None
        return hook

    def remove(self, hook):
        """Unregister ``hook`` (the very object); see :meth:`hookloop.Trainer.remove_hook`."""
        if self.frozen:
            raise ConfigError(f'cannot remove {type(hook).__name__} {self.frozen}: the hooks of a run are fixed '
                              'when it starts')
        entries = [entry for entry in self._entries if entry[2] is hook]
        if not entries:
            raise ConfigError(f'{getattr(hook, "name", type(hook).__name__)} is not registered')
        self._entries.remove(entries[0])
        self._defaults.discard(id(hook))
        self._table = None

    def register_training_hooks(self, lr_config=None, optimizer_config=None, checkpoint_config=None,
                                log_config=None, momentum_config=None, timer_config=None,
                                custom_hooks_config=None):
        """MMCV's ``register_training_hooks``, with MMCV's priorities (see the Trainer's)."""
        if lr_config is not None:
            self.register(policy_hook_cfg(lr_config, 'LrUpdaterHook'), priority='VERY_HIGH')
        if momentum_config is not None:
            self.register(policy_hook_cfg(momentum_config, 'MomentumUpdaterHook'), priority='HIGH')
        if optimizer_config is not None:
            self.register(hook_cfg(optimizer_config, 'OptimizerHook'), priority='ABOVE_NORMAL')
        if checkpoint_config is not None:
            self.register(hook_cfg(checkpoint_config, 'CheckpointHook'), priority='NORMAL')
        if timer_config is not None:
            self.register(hook_cfg(timer_config, 'IterTimerHook'), priority='LOW')
        if log_config is not None:
            self._register_logger_hooks(log_config)
        if custom_hooks_config is not None:
            if isinstance(custom_hooks_config, (Mapping, Hook)):
                custom_hooks_config = [custom_hooks_config]
            for cfg in custom_hooks_config:
                self.register(cfg)

    def register_evaluation(self, evaluation):
        self.register(hook_cfg(evaluation, 'EvaluationHook'), priority='LOW')

    def _register_logger_hooks(self, log_config):
        if not isinstance(log_config, Mapping):
            raise ConfigError(f'log_config must be a dict like dict(interval=10, hooks=[...]), got {log_config!r}')
        log_config = dict(log_config)
        interval = log_config.pop('interval', 10)
        self._log_interval = interval
        hooks = log_config.pop('hooks', [dict(type='TextLoggerHook')])
        if log_config:
            raise ConfigError(f'log_config got unexpected keys {sorted(log_config)}; use interval and hooks')
        for cfg in hooks:
            if isinstance(cfg, Mapping):
                cfg = dict(cfg)
                kind = HOOKS.get(cfg['type']) if isinstance(cfg.get('type'), str) else cfg.get('type')
                if kind is not None and 'interval' not in cfg and _accepts(kind, 'interval'):
                    cfg['interval'] = interval
            self.register(cfg, priority='VERY_LOW')

    def add_defaults(self, has_optimizer, has_val):
        """Fill the roles the user left empty: optimizer step, timer, text log, evaluation,
        the non-finite loss guard, preemption when there is a checkpoint hook, the work dir lock check."""
        roles = {role_of(hook) for _, _, hook, _ in self._entries}
        defaults = []
        if 'optimizer' not in roles and has_optimizer:
            defaults.append(dict(type='OptimizerHook'))
        if 'timer' not in roles:
            defaults.append(dict(type='IterTimerHook'))
        if 'logger' not in roles:
            defaults.append(dict(type='TextLoggerHook'))
        if 'evaluation' not in roles and has_val:
            defaults.append(dict(type='EvaluationHook'))
        if 'invalid_loss' not in roles and has_optimizer:  # no silent NaN (hooks/finite_loss.py)
            defaults.append(dict(type='FiniteLossGuard'))
        if 'checkpoint' in roles and 'preemption' not in roles:  # SIGTERM / Ctrl-C save by default
            defaults.append(dict(type='PreemptionHook'))
        if 'work_dir_lock' not in roles:  # a run whose lock was taken away stops at its next log event
            defaults.append(dict(type='WorkDirLockHook', interval=self._log_interval))
        for cfg in defaults:
            # A default stands in for an empty role until a hook of that role is registered.
            self._defaults.add(id(self.register(cfg)))

    def stage_table(self):
        """stage -> hooks in run order (cached until the next registration)."""
        if self._table is None:
            self._table = stage_table(self.hooks)
        return self._table

    def format_table(self):
        return format_stage_table(self.stage_table(), self.priority_of)


__all__ = ['HookList', 'hook_cfg', 'policy_hook_cfg']
