"""A ModelScope configuration as ModelScope's own code sees it: what ``cfg_modify_fn`` receives.

:class:`ModelScopeConfig` is hookloop's :class:`~hookloop.config.Config` (attribute access,
``to_dict``) with ModelScope's ``merge_from_dict``, which merges: ``{'train.max_epochs': 3}``
sets one key, and ``{'train': {'max_epochs': 3}}`` changes that key and keeps the rest of
``train`` (hookloop's dotted ``--cfg-options`` replace a dict given as a value). ``safe_get``
reads a dotted key or a default.
"""
import copy
from collections.abc import Mapping

from ..config.loader import Config, load_config, set_dotted
from ..errors import ConfigError


class ModelScopeConfig(Config):
    """A configuration dict with ModelScope's ``merge_from_dict`` and ``safe_get``."""

    def __deepcopy__(self, memo):
        return ModelScopeConfig({k: copy.deepcopy(v, memo) for k, v in self.items()})

    def merge_from_dict(self, options):
        """Merge ``options`` in place: a dotted key addresses a nested key (``'hooks.0.interval'`` an
        item of a list); a dict value is merged into the dict already there, key by key
        (ModelScope's rule), any other value replaces what is there."""
        for dotted, value in options.items():
            present = self.safe_get(dotted)
            if isinstance(value, Mapping) and isinstance(present, Mapping):
                _merge_into(present, value)
            else:
                set_dotted(self, str(dotted), value)

    def safe_get(self, dotted, default=None):
        """The value at ``'a.b.c'``, or ``default`` when a key on the way is missing."""
        node = self
        for key in str(dotted).split('.'):
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, Mapping) and key in node:
                node = node[key]
            else:
                return default
        return node


def _merge_into(target, source):
    for key, value in source.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), Mapping):
            _merge_into(target[key], value)
        else:
            target[key] = value


def load_configuration(cfg_file, cfg_modify_fn=None, cfg_options=None):
    """``configuration.json`` (or any config file) as a :class:`ModelScopeConfig`, after
    ``cfg_modify_fn(cfg)`` (which returns the config) and ``cfg_options`` (dotted overrides),
    in ModelScope's order; the result is a copy the caller may change."""
    cfg = ModelScopeConfig(load_config(cfg_file))
    if cfg_modify_fn is not None:
        cfg = cfg_modify_fn(cfg)
        if not isinstance(cfg, Mapping):
            raise ConfigError(f'cfg_modify_fn must return the config, got {type(cfg).__name__}')
    cfg = ModelScopeConfig(copy.deepcopy(dict(cfg)))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


__all__ = ['ModelScopeConfig', 'load_configuration']
