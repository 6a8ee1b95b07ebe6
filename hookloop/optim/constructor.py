"""Optimizers from MMCV-style configs: ``paramwise_cfg``, ``constructor=`` and several
optimizers over named sub-modules (GANs).

``DefaultOptimizerConstructor`` follows MMCV 1.x's rules, so a config brings the same
parameter groups and the same multipliers:

* no ``paramwise_cfg``: one group with all the model's parameters;
* with it, one group per parameter, visited module by module (``named_children`` order).
  A ``custom_keys`` entry whose key is a substring of the parameter's full name wins (the
  longest key first, ties alphabetical): ``lr = base_lr * lr_mult``, and with a base weight
  decay ``weight_decay = base_wd * decay_mult``. Otherwise: a ``bias`` outside a norm layer
  gets ``bias_lr_mult``; weight decay is ``norm_decay_mult`` for norm layers (BatchNorm,
  InstanceNorm, GroupNorm, LayerNorm), else ``dwconv_decay_mult`` for depthwise convs
  (``Conv2d`` with ``groups == in_channels``), else ``bias_decay_mult`` for biases.
  Frozen parameters keep a group of their own with no change. ``bypass_duplicate`` skips a
  parameter already placed (shared weights) instead of failing in the optimizer.
"""
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from ..errors import ConfigError, ConfigTypeError
from ..registry import OPTIMIZERS, Registry

OPTIMIZER_CONSTRUCTORS = Registry('optimizer constructor')

_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.GroupNorm,
               nn.LayerNorm)
_PARAMWISE_KEYS = ('bias_lr_mult', 'bias_decay_mult', 'norm_decay_mult', 'dwconv_decay_mult',
                   'dcn_offset_lr_mult', 'bypass_duplicate', 'custom_keys')


@OPTIMIZER_CONSTRUCTORS.register_module()
class DefaultOptimizerConstructor:
    """``constructor(model)`` -> the optimizer ``optimizer_cfg`` describes, with the
    ``paramwise_cfg`` rules above. Subclass it and register it in
    ``OPTIMIZER_CONSTRUCTORS`` to change how groups are made (``optimizer=dict(...,
    constructor='MyConstructor')``); a subclass overriding ``add_params`` or ``__call__``
    may take ``paramwise_cfg`` keys of its own. A non-dict ``paramwise_cfg`` is a
    :class:`~hookloop.errors.ConfigTypeError` (a ``TypeError``, as in MMCV)."""

    def __init__(self, optimizer_cfg, paramwise_cfg=None):
        if not isinstance(optimizer_cfg, Mapping):
            raise ConfigTypeError(f'optimizer config must be a dict, got {optimizer_cfg!r}')
        if paramwise_cfg is not None and not isinstance(paramwise_cfg, Mapping):
            raise ConfigTypeError(f'paramwise_cfg must be None or a dict, got {type(paramwise_cfg).__name__} '
                                  f'{paramwise_cfg!r}')
        self.optimizer_cfg = dict(optimizer_cfg)
        self.paramwise_cfg = dict(paramwise_cfg or {})
        self.base_lr = self.optimizer_cfg.get('lr')
        self.base_wd = self.optimizer_cfg.get('weight_decay')
        self._validate()

    def _validate(self):
        # A subclass that makes its own groups (mmaction2's TSM, mmseg's layer decay) reads its
        # own paramwise_cfg keys (decay_rate, num_layers, fc_lr5): only the base's rules are checked.
        own_rules = type(self).add_params is DefaultOptimizerConstructor.add_params and \
            type(self).__call__ is DefaultOptimizerConstructor.__call__
        unknown = sorted(set(self.paramwise_cfg) - set(_PARAMWISE_KEYS))
        if unknown and own_rules:
            raise ConfigError(f'paramwise_cfg got unknown keys {unknown}; known: {", ".join(_PARAMWISE_KEYS)}')
        custom_keys = self.paramwise_cfg.get('custom_keys', {})
        if not isinstance(custom_keys, Mapping) or not all(isinstance(v, Mapping) for v in custom_keys.values()):
            raise ConfigTypeError(f'paramwise_cfg custom_keys must map names to dicts like dict(lr_mult=0.1), '
                                  f'got {custom_keys!r}')
        if self.base_wd is None:
            needs_wd = [k for k in ('bias_decay_mult', 'norm_decay_mult', 'dwconv_decay_mult') if k in self.paramwise_cfg]
            needs_wd += [f'custom_keys[{k!r}].decay_mult' for k, v in custom_keys.items() if 'decay_mult' in v]
            if needs_wd:
                raise ConfigError(f'paramwise_cfg sets {", ".join(needs_wd)} but the optimizer has no weight_decay')

    def __call__(self, model):
        model = getattr(model, 'module', model)  # DataParallel / DDP wrappers
        cfg = dict(self.optimizer_cfg)
        if not self.paramwise_cfg:
            cfg['params'] = [p for p in model.parameters()]
        else:
            groups = []
            self.add_params(groups, model)
            cfg['params'] = groups
        if not cfg['params']:
            raise ConfigError('the model has no parameters for the optimizer')
        return OPTIMIZERS.build(cfg)

    @staticmethod
    def _is_in(group, groups):
        params = set(group['params'])
        return any(params & set(other['params']) for other in groups)

    def add_params(self, groups, module, prefix=''):
        """Append one group per parameter of ``module`` and its children to ``groups``."""
        custom_keys = self.paramwise_cfg.get('custom_keys', {})
        sorted_keys = sorted(sorted(custom_keys), key=len, reverse=True)
        get = self.paramwise_cfg.get
        is_norm = isinstance(module, _NORM_TYPES)
        is_dwconv = isinstance(module, nn.Conv2d) and module.in_channels == module.groups
        for name, param in module.named_parameters(recurse=False):
            group = {'params': [param]}
            if not param.requires_grad:
                groups.append(group)
                continue
            if get('bypass_duplicate', False) and self._is_in(group, groups):
                # MMCV's words (its tests and users match them): the module's name, not the parameter's
                warnings.warn(f'{prefix} is duplicate. It is skipped since bypass_duplicate={get("bypass_duplicate")}')
                continue
            full_name = f'{prefix}.{name}'
            key = next((k for k in sorted_keys if k in full_name), None)
            if key is not None:
                group['lr'] = self.base_lr * custom_keys[key].get('lr_mult', 1.)
                if self.base_wd is not None:
                    group['weight_decay'] = self.base_wd * custom_keys[key].get('decay_mult', 1.)
            else:
                if name == 'bias' and not is_norm:
                    group['lr'] = self.base_lr * get('bias_lr_mult', 1.)
                if self.base_wd is not None:
                    if is_norm:
                        group['weight_decay'] = self.base_wd * get('norm_decay_mult', 1.)
                    elif is_dwconv:
                        group['weight_decay'] = self.base_wd * get('dwconv_decay_mult', 1.)
                    elif name == 'bias':
                        group['weight_decay'] = self.base_wd * get('bias_decay_mult', 1.)
            groups.append(group)
        for child_name, child in module.named_children():
            self.add_params(groups, child, f'{prefix}.{child_name}' if prefix else child_name)


class OptimizerDict(dict):
    """Several optimizers by name (``{'generator': Adam, 'discriminator': Adam}``), as MMCV
    passes them to ``model.train_step``. For the hooks it also acts as one optimizer: its
    ``param_groups`` are all the groups of all optimizers (so LR and momentum schedules
    update every one of them, as MMCV's updaters do), and ``state_dict`` holds each
    optimizer's state under its name."""

    @property
    def param_groups(self):
        return [group for optimizer in self.values() for group in optimizer.param_groups]

    def state_dict(self):
        return {name: optimizer.state_dict() for name, optimizer in self.items()}

    def load_state_dict(self, state):
        missing = sorted(set(self) - set(state))
        if missing:
            raise KeyError(f'no state for optimizer(s) {missing} (the checkpoint has {sorted(state)})')
        for name, optimizer in self.items():
            optimizer.load_state_dict(state[name])

    def zero_grad(self, set_to_none=True):
        for optimizer in self.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self):
        for optimizer in self.values():
            optimizer.step()


def is_optimizer_dict_cfg(cfg):
    """MMCV's multi-optimizer shape: a dict (no ``type``) whose values are all dicts."""
    return isinstance(cfg, Mapping) and 'type' not in cfg and bool(cfg) and \
        all(isinstance(v, Mapping) for v in cfg.values())


def build_optimizer(model, cfg):
    """MMCV's ``build_optimizer(model, cfg)``: ``cfg`` may carry ``paramwise_cfg`` and
    ``constructor`` (a name in ``OPTIMIZER_CONSTRUCTORS``, default the MMCV rules above).
    mmselfsup's spelling ``paramwise_options`` goes to the constructor as its ``paramwise_cfg``
    (as mmselfsup's ``build_optimizer`` passes it) when the constructor is one a repository
    registered; hookloop's own rules do not read it (see :func:`paramwise_options`)."""
    cfg = dict(cfg)
    constructor = cfg.pop('constructor', 'DefaultOptimizerConstructor')
    paramwise_cfg = cfg.pop('paramwise_cfg', None)
    kind = OPTIMIZER_CONSTRUCTORS.get(constructor) if isinstance(constructor, str) else constructor
    if 'paramwise_options' in cfg:
        paramwise_cfg = paramwise_options(cfg.pop('paramwise_options'), paramwise_cfg, kind)
    return OPTIMIZER_CONSTRUCTORS.build(dict(type=kind, optimizer_cfg=cfg, paramwise_cfg=paramwise_cfg))(model)


def paramwise_options(options, paramwise_cfg, constructor):
    """The ``paramwise_cfg`` that mmselfsup's ``paramwise_options`` (regular expressions of
    parameter names -> options) stands for, or a ConfigError when ``constructor`` is
    hookloop's own (MMCV's rules: ``custom_keys``, ``bias_lr_mult``...), which cannot read it."""
    if paramwise_cfg is not None:
        raise ConfigError('optimizer has both paramwise_cfg and paramwise_options (mmselfsup\'s name for the '
                          'same thing); keep one')
    if constructor is DefaultOptimizerConstructor:
        raise ConfigError("optimizer paramwise_options is mmselfsup's key (regular expressions of parameter names "
                          "-> options), read by mmselfsup's own DefaultOptimizerConstructor, which is not "
                          "registered: import it first (custom_imports=dict(imports=['mmselfsup.core'])), or "
                          'write it as paramwise_cfg=dict(custom_keys={...}) for the MMCV rules')
    return options


def build_optimizers(model, cfgs):
    """One optimizer, or (``{name: cfg, ...}``) an :class:`OptimizerDict` with an optimizer
    per sub-module ``model.<name>``, as mmgen / mmedit build them."""
    if not is_optimizer_dict_cfg(cfgs):
        return build_optimizer(model, cfgs)
    model = getattr(model, 'module', model)
    missing = [name for name in cfgs if not isinstance(getattr(model, name, None), nn.Module)]
    if missing:
        children = [name for name, _ in model.named_children()]
        raise ConfigError(f'optimizer config names sub-modules {missing} that the model does not have '
                          f'(its sub-modules: {children})')
    return OptimizerDict({name: build_optimizer(getattr(model, name), cfg) for name, cfg in cfgs.items()})


def as_optimizer(value):
    """A Mapping of built optimizers becomes an :class:`OptimizerDict`; others pass through."""
    if isinstance(value, Mapping) and value and all(isinstance(v, torch.optim.Optimizer) for v in value.values()):
        return value if isinstance(value, OptimizerDict) else OptimizerDict(value)
    return value


__all__ = ['DefaultOptimizerConstructor', 'OPTIMIZER_CONSTRUCTORS', 'OptimizerDict', 'build_optimizer',
           'build_optimizers', 'is_optimizer_dict_cfg', 'as_optimizer', 'paramwise_options']
