"""The MMCV names the trainer answers to: the runner attributes hooks written for MMCV read
on the object they receive, the checkpoint helpers MMCV code calls, and the MMCV 1.x config
keys a Trainer refuses (``build_trainer`` translates them, :mod:`hookloop.compat.mmcv_config`).

:class:`MMCVRunnerAttributes` is a base of :class:`~hookloop.Trainer`, so a hook ported
from MMCV (mmdet's ``NumClassCheckHook`` reads ``runner.data_loader``; others read
``runner.log_buffer``, ``runner.meta``, ``runner.model_name``...) finds them. They are views
of the trainer's state: ``data_loader`` is the loader of the current mode, ``log_buffer``
writes into and reads from ``trainer.meters``; nothing here runs per iteration.
"""
from collections import OrderedDict
from collections.abc import Mapping

from ..errors import ConfigError
from ..registry import closest_names

# MMCV 1.x config keys that only a translation turns into Trainer arguments (they never reach it).
MMCV_KEYS = ('runner', 'total_epochs', 'total_iters', 'optimizers', 'workflow', 'dist_params', 'gpu_ids',
             'opencv_num_threads',
             'mp_start_method', 'cudnn_benchmark', 'auto_scale_lr', 'fp16', 'data', 'train_cfg', 'test_cfg')
# The keys of an ``evaluation`` dict that are EvaluationHook's; others are MMCV's dataset options.
EVAL_HOOK_KEYS = ('interval', 'by_epoch', 'start', 'save_best', 'rule', 'type', 'priority', 'greater_keys',
                  'less_keys', 'dynamic_intervals')


class LogBuffer:
    """MMCV's ``runner.log_buffer`` over ``trainer.meters``: ``update({'name': value})`` adds
    values the logger hooks log; ``output`` holds the current averages (read at log events)."""

    def __init__(self, trainer):
        self._trainer = trainer

    def update(self, vars, count=1):  # noqa: A002 (MMCV's argument name)
        if not isinstance(vars, dict):
            raise TypeError(f'log_buffer.update takes a dict, got {type(vars).__name__}')
        self._trainer.meters.update_dict(vars)

    @property
    def output(self):
        return OrderedDict(self._trainer.meters.averages())

    @property
    def ready(self):
        return bool(self.output)

    @property
    def val_history(self):
        return OrderedDict((key, [value]) for key, value in self.output.items())

    def average(self, n=0):
        """The averages are computed when read (``output``)."""

    def clear_output(self):
        """Nothing to clear: ``output`` is computed when read."""

    def clear(self):
        self._trainer.meters.clear()


class MMCVRunnerAttributes:
    """MMCV ``BaseRunner`` names on the trainer (read-only where hookloop owns the state).

    ``data_loader`` (the current mode's loader), ``log_buffer``, ``meta`` (the dict an MMCV
    runner was given; ``None`` otherwise; checkpoint and evaluation hooks record
    ``meta['hook_msgs']`` in it), ``model_name``, ``current_lr()``, ``current_momentum()``,
    ``get_hook_info()``, the ``register_*_hook`` methods and ``train_outputs`` (ModelScope's); ``call_hook``, ``outputs``,
    ``epoch``, ``iter``, ``inner_iter``, ``max_epochs``, ``max_iters``, ``rank``,
    ``world_size``, ``timestamp``, ``work_dir``, ``logger``, ``mode`` are the trainer's own.
    """

    meta = None

    @property
    def data_loader(self):
        return self.train_dataloader if self.mode == 'train' else self.val_dataloader

    @property
    def log_buffer(self):
        return LogBuffer(self)

    @property
    def train_outputs(self):  # ModelScope's name of ``outputs``
        return self.outputs

    @property
    def model_name(self):
        model = getattr(self.model, 'module', self.model)
        return type(model).__name__

    def current_lr(self):
        """The learning rates of the parameter groups (a dict of lists for several optimizers)."""
        return _per_optimizer(self.optimizer, lambda group: group['lr'])

    def current_momentum(self):
        """The momentum (or Adam's first beta) of the parameter groups."""
        from ..hooks.momentum_updater import group_momentum
        return _per_optimizer(self.optimizer, group_momentum)

    # -- MMCV's register_* methods -------------------------------------------------------
    def register_hook_from_cfg(self, hook_cfg):
        return self.register_hook(dict(hook_cfg))

    def register_lr_hook(self, lr_config):
        if lr_config is not None:
            self.register_training_hooks(lr_config=lr_config)

    def register_momentum_hook(self, momentum_config):
        if momentum_config is not None:
            self.register_training_hooks(momentum_config=momentum_config)

    def register_optimizer_hook(self, optimizer_config):
        if optimizer_config is not None:
            self.register_training_hooks(optimizer_config=optimizer_config)

    def register_checkpoint_hook(self, checkpoint_config):
        if checkpoint_config is not None:
            self.register_training_hooks(checkpoint_config=checkpoint_config)

    def register_timer_hook(self, timer_config):
        if timer_config is not None:
            self.register_training_hooks(timer_config=timer_config)

    def register_logger_hooks(self, log_config):
        if log_config is not None:
            self.register_training_hooks(log_config=log_config)

    def register_custom_hooks(self, custom_config):
        if custom_config is not None:
            self.register_training_hooks(custom_hooks_config=custom_config)

    def get_hook_info(self):
        """The hooks that run at each stage, one stage per block (MMCV's format)."""
        return self.hook_order_table()


def _per_optimizer(optimizer, read):
    if optimizer is None:
        raise RuntimeError('there is no optimizer')
    if isinstance(optimizer, dict):
        return {name: [read(g) for g in opt.param_groups] for name, opt in optimizer.items()}
    return [read(g) for g in optimizer.param_groups]


def revise_state_keys(state, revise_keys):
    """``state`` with its keys renamed by ``[(regex, replacement), ...]`` (MMCV's
    ``revise_keys``), keeping the state dict's ``_metadata`` (the modules' versions, which
    versioned modules read to convert old checkpoints), its keys renamed the same way."""
    import re
    metadata = getattr(state, '_metadata', None)
    for pattern, replacement in revise_keys or ():
        state = OrderedDict((re.sub(pattern, replacement, key), value) for key, value in state.items())
        if metadata is not None:
            renamed = OrderedDict(metadata)  # a prefix a rule does not rename stays as it was
            renamed.update((_revise_prefix(pattern, replacement, key), value) for key, value in metadata.items())
            metadata = renamed
    if metadata is not None:
        if not isinstance(state, OrderedDict):
            state = OrderedDict(state)
        state._metadata = metadata
    return state


def _revise_prefix(pattern, replacement, prefix):
    """A module prefix of ``_metadata`` (``'module.bn'``, ``''`` for the root) renamed as the
    keys under it are: the rule sees it with its trailing dot, as in ``'module.bn.weight'``."""
    import re
    revised = re.sub(pattern, replacement, f'{prefix}.' if prefix else '')
    return revised[:-1] if revised.endswith('.') else revised


def model_meta(model):
    """What MMCV's tools read from a checkpoint's ``meta`` about the model: ``CLASSES``
    (mmdet's ``model.CLASSES``, read back by ``init_detector``)."""
    classes = getattr(getattr(model, 'module', model), 'CLASSES', None)
    return {} if classes is None else {'CLASSES': classes}


def needs_translation(cfg):
    """True when ``cfg`` holds an MMCV key, ``custom_imports`` as a dict or dataset options in ``evaluation``."""
    evaluation = cfg.get('evaluation')
    return any(key in cfg for key in MMCV_KEYS) or isinstance(cfg.get('custom_imports'), Mapping) or (
        isinstance(evaluation, Mapping) and bool(set(evaluation) - set(EVAL_HOOK_KEYS)))


def refuse_untranslated(arguments, unknown, known):
    """The ConfigError for ``Trainer(...)`` given MMCV 1.x config (``arguments`` that need a
    translation) or names it does not take (``unknown``; ``known``: the names it takes), all
    problems in one error. Config files go through ``build_trainer``, which translates them."""
    mmcv = [name for name in unknown if name in MMCV_KEYS]
    problems = []
    if mmcv or needs_translation({key: arguments[key] for key in ('custom_imports', 'evaluation') if key in arguments}):
        shown = ', '.join(f'{name}=' for name in mmcv) or 'custom_imports=dict(...) or evaluation=dict(metric=...)'
        problems.append(f'{shown}: MMCV 1.x config, which Trainer() does not translate; build the trainer with '
                        'hookloop.build_trainer(default_args=cfg), which translates it (docs/migration.md)')
    for name in unknown:
        if name not in MMCV_KEYS:
            hint = closest_names(name, list(known) + list(MMCV_KEYS), n=1)
            problems.append(f'Trainer got an unexpected argument {name!r}' +
                            (f'; did you mean {hint[0]!r}?' if hint else ''))
    if len(problems) == 1:
        return ConfigError(problems[0])
    return ConfigError(f'Trainer() got {len(problems)} problems:\n  - ' + '\n  - '.join(problems))
