"""Registries map the ``type`` names of config dicts to classes or functions.

``HOOKS.build(dict(type='EMAHook', interval=4))`` looks up ``'EMAHook'`` and calls
it with the remaining keys. Unknown names and bad keywords are refused with a
:class:`~hookloop.errors.ConfigError` that says what would have worked.
"""
import difflib
import inspect
from collections.abc import Mapping

from .errors import ConfigError


def closest_names(name, candidates, n=3):
    """Up to ``n`` names from ``candidates`` that look like ``name`` (typos, case)."""
    candidates = list(candidates)
    lowered = {c.lower(): c for c in candidates}
    found = [lowered[name.lower()]] if name.lower() in lowered else []
    found += [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)]
    found += [c for c in candidates if name.lower() in c.lower()]
    return list(dict.fromkeys(found))[:n]


def check_call_arguments(target, kwargs, what=None):
    """Raise ConfigError naming ``target`` and the keyword if ``target(**kwargs)`` cannot bind."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    params = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    name = what or getattr(target, '__name__', repr(target))
    accepted = [p for p, v in params.items() if v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in accepted:
            hint = closest_names(key, accepted)
            hint = f'; did you mean {", ".join(map(repr, hint))}?' if hint else ''
            raise ConfigError(f'{name} got an unexpected argument {key!r}{hint} '
                              f'(accepted: {", ".join(accepted) or "none"})')
    try:
        signature.bind_partial(**kwargs)
    except TypeError as exc:
        raise ConfigError(f'{name}: {exc}') from None


# Modules whose import registers hookloop's own entries (hooks, trainers). ``import hookloop``
# is lazy (no torch for ``hookloop --help``), so they are imported at a registry's first lookup.
BUILTIN_MODULES = ('hookloop.hooks', 'hookloop.data.hf_dataset', 'hookloop.dreambooth',
                   'hookloop.compat.modelscope_diffusion')
_builtins_loaded = False


def _load_builtins():
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        import importlib
        for module in BUILTIN_MODULES:
            importlib.import_module(module)


class Registry:
    """A named table of classes (or factory functions) buildable from config dicts."""

    def __init__(self, name):
        self.name = name
        self._modules = {}

    def __repr__(self):
        return f'Registry({self.name!r}, {len(self._modules)} entries)'

    def __contains__(self, name):
        _load_builtins()
        return name in self._modules

    def __len__(self):
        _load_builtins()
        return len(self._modules)

    def keys(self):
        _load_builtins()
        return list(self._modules)

    @property
    def module_dict(self):
        """MMCV's name: ``{name: class}`` (a copy)."""
        _load_builtins()
        return dict(self._modules)

    def get(self, name):
        """The registered object called ``name``; ConfigError with suggestions if unknown."""
        try:
            return self._modules[name]
        except KeyError:
            _load_builtins()
        if name in self._modules:
            return self._modules[name]
        hint = closest_names(name, self._modules)
        hint = f'; closest: {", ".join(hint)}' if hint else ''
        raise ConfigError(f'{name!r} is not registered in the {self.name} registry{hint}')

    def register_module(self, module=None, module_name=None, force=False, name=None):
        """Register a class or function, as a decorator or as a call.

        ``@HOOKS.register_module()``, ``@HOOKS.register_module(module_name='Alias')``,
        ``HOOKS.register_module(module=MyHook)`` and ``HOOKS.register_module(MyHook)``
        all work; ``force=True`` replaces an existing entry of the same name.
        """
        module_name = module_name or name
        if module is not None:
            self._add(module, module_name, force)
            return module

        def decorator(target):
            self._add(target, module_name, force)
            return target
        return decorator

    def _add(self, module, module_name, force):
        if not callable(module):
            raise ConfigError(f'{self.name} registry: can only register classes or functions, got {module!r}')
        names = module_name if isinstance(module_name, (list, tuple)) else [module_name or module.__name__]
        for key in names:
            if not force and key in self._modules and self._modules[key] is not module:
                raise ConfigError(f'{key!r} is already registered in the {self.name} registry '
                                  f'(by {self._modules[key]!r}); pass force=True to replace it')
            self._modules[key] = module

    def build(self, cfg, default_args=None, **more_defaults):
        """Build from ``dict(type=NAME_OR_CLASS, **kwargs)``; ``default_args`` (a dict, as in
        MMCV) and keyword arguments fill missing keys."""
        default_args = {**(default_args or {}), **more_defaults}
        if not isinstance(cfg, Mapping):
            raise ConfigError(f'{self.name} config must be a dict with a "type" key, got {type(cfg).__name__}')
        kwargs = dict(cfg)
        if 'type' not in kwargs:
            raise ConfigError(f'{self.name} config {dict(cfg)!r} has no "type" key')
        kind = kwargs.pop('type')
        target = self.get(kind) if isinstance(kind, str) else kind
        if not callable(target):
            raise ConfigError(f'{self.name} config "type" must be a name or a class, got {kind!r}')
        for key, value in default_args.items():
            kwargs.setdefault(key, value)
        label = getattr(target, '__name__', kind if isinstance(kind, str) else repr(kind))
        check_call_arguments(target, kwargs, what=label)
        try:
            return target(**kwargs)
        except ConfigError:
            raise
        except TypeError as exc:
            raise ConfigError(f'{label}: {exc}') from exc


HOOKS = Registry('hook')
TRAINERS = Registry('trainer')
OPTIMIZERS = Registry('optimizer')
MODELS = Registry('model')
DATASETS = Registry('dataset')
METRICS = Registry('metric')


def _register_torch_optimizers():
    import torch
    for name in dir(torch.optim):
        obj = getattr(torch.optim, name)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer:
            OPTIMIZERS.register_module(module=obj)


_register_torch_optimizers()
