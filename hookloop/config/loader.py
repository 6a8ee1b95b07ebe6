"""Config files: ``.py`` (top-level names), ``.yaml``/``.yml`` and ``.json``.

``_base_ = 'base.py'`` (or a list) inherits from other files, merging dicts key by
key; a dict with ``_delete_=True`` replaces its base instead; ``{{_base_.name}}`` in a
``.py`` file is the base's value of ``name`` (``hookloop/config/refs.py``). ``--cfg-options``
items (``a.b.c=VALUE``) override values; VALUE is read as a Python literal, or
kept as a string when it is not one. A ``.json`` / ``.yaml`` config runs no Python, and every
load is bounded (``hookloop/config/bounds.py``).
"""
import ast
import copy
import json
import os
import runpy

from ..errors import ConfigError
from . import bounds

DATA_EXTENSIONS = ('.json', '.yaml', '.yml')


class Config(dict):
    """A dict with attribute access (``cfg.optimizer.lr``), nested all the way down."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for key, value in self.items():
            super().__setitem__(key, _wrap(value))

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f'config has no key {name!r}') from None

    def __setattr__(self, name, value):
        self[name] = value

    def __setitem__(self, key, value):
        super().__setitem__(key, _wrap(value))

    def __deepcopy__(self, memo):
        return Config({k: copy.deepcopy(v, memo) for k, v in self.items()})

    def to_dict(self):
        return _unwrap(self)

    @classmethod
    def fromfile(cls, path):
        return cls(load_config(path))

    def merge_from_dict(self, options):
        """Apply ``{'a.b.c': value}`` overrides in place."""
        for dotted, value in options.items():
            set_dotted(self, dotted, value)


def _wrap(value):
    if isinstance(value, dict) and not isinstance(value, Config):
        return Config(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def _unwrap(value):
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    return value


def _read_file(path):
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == '.py':
            return _top_level(runpy.run_path(path))
        text = bounds.read_text(path)
        if ext in ('.yaml', '.yml'):
            import yaml
            data = yaml.safe_load(text)
        elif ext == '.json':
            data = json.loads(text)
        else:
            raise ConfigError(f'config {path!r}: unsupported extension {ext!r} (use .py, .yaml, .yml or .json)')
    except ConfigError:
        raise
    except SyntaxError as exc:
        raise ConfigError(f'config {path!r} does not parse: {exc.msg} (line {exc.lineno})') from None
    except Exception as exc:  # yaml/json/python errors: one clear line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f'config {path!r} does not parse: {first}') from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f'config {path!r} must hold a mapping of names to values, got {type(data).__name__}')
    bounds.check_expansion(data, path)
    return data


def _is_data_file(path):
    """A ``.json`` / ``.yaml`` config: it may come from elsewhere (a model hub) and runs no code."""
    return os.path.splitext(path)[1].lower() in DATA_EXTENSIONS


def _top_level(names):
    """A .py config's names: not private (except ``_base_``), not imported modules."""
    return {k: v for k, v in names.items()
            if not k.startswith('__') and not (k.startswith('_') and k != '_base_') and not _is_module_or_import(v)}


def _is_module_or_import(value):
    import types
    return isinstance(value, types.ModuleType)


def merge(base, override):
    """``override`` merged into a copy of ``base``, dict by dict."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and value.get('_delete_'):
            result[key] = {k: v for k, v in value.items() if k != '_delete_'}
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def load_config(path):
    """The config at ``path`` as a plain dict, with its ``_base_`` files merged in.

    A ``.py`` config runs (MMCV's rights: its bases may be ``.py``, ``.json`` or ``.yaml``).
    A ``.json`` / ``.yaml`` config never runs Python: a ``.py`` file among its ``_base_`` files,
    at any depth, is refused. Every load is bounded (:mod:`hookloop.config.bounds`)."""
    path = os.path.abspath(os.fspath(path))
    merged = _load(path, (), bounds.LoadBudget(), None)
    bounds.check_expansion(merged, path, 'the merged config of')
    return merged


def _load(path, chain, budget, data_file):
    """``path`` merged over its bases; ``chain``: the files that named it, ``data_file``: the
    first ``.json`` / ``.yaml`` file among them (None when there is none)."""
    if not os.path.isfile(path):
        raise ConfigError(f'config file {path!r} does not exist')
    if path in chain:
        raise ConfigError(f'config {path!r} inherits from itself through _base_')
    if data_file is not None and not _is_data_file(path):
        raise ConfigError(f'config {data_file!r} names {path!r} as a _base_: a .json/.yaml config may come from '
                          'elsewhere (a model hub) and never runs Python; only a .py config may inherit from a .py '
                          'file')
    budget.take(path, chain + (path,))
    if data_file is None and _is_data_file(path):
        data_file = path
    from . import refs as config_refs
    if config_refs.has_references(path):  # {{_base_.name}}: the bases are read first
        text, names = config_refs.substitute(path)
        merged = _load_bases(path, config_refs.read_bases(path, text), chain, budget, data_file)
        data = _top_level(config_refs.run(path, text, names, merged))
        data.pop('_base_', None)
        return merge(merged, data)
    data = _read_file(path)
    if not data:
        raise ConfigError(f'config {path!r} is empty')
    return merge(_load_bases(path, data.pop('_base_', []), chain, budget, data_file), data)


def _load_bases(path, bases, chain, budget, data_file):
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, (list, tuple)) or not all(isinstance(base, str) for base in bases):
        raise ConfigError(f'config {path!r}: _base_ must be a string or a list of strings')
    merged = {}
    for base in bases:
        base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
        merged = merge(merged, _load(os.path.abspath(base_path), chain + (path,), budget, data_file))
    return merged


def parse_value(text):
    """A ``--cfg-options`` value: a Python literal where it is one, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_options(items):
    """``['a.b=1', 'c="x"']`` -> ``{'a.b': 1, 'c': 'x'}``; an item without ``=`` is an error."""
    options = {}
    for item in items or []:
        if '=' not in item:
            raise ConfigError(f'--cfg-options item {item!r} has no "="; write KEY=VALUE, e.g. optimizer.lr=0.01')
        key, value = item.split('=', 1)
        if not key:
            raise ConfigError(f'--cfg-options item {item!r} has an empty key')
        options[key.strip()] = parse_value(value.strip())
    return options


def set_dotted(cfg, dotted, value):
    """``cfg['a']['b']['c'] = value`` for ``'a.b.c'``; list items by index (``'hooks.0.type'``)."""
    keys = dotted.split('.')
    node = cfg
    for depth, key in enumerate(keys[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, key, dotted)]
            continue
        if key not in node or not isinstance(node[key], (dict, list)):
            node[key] = {}
        node = node[key]
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(node, last, dotted)] = value
    else:
        node[last] = value


def _list_index(node, key, dotted):
    try:
        index = int(key)
        node[index]
    except (ValueError, IndexError):
        raise ConfigError(f'--cfg-options {dotted!r}: {key!r} is not an index of a list of {len(node)}') from None
    return index
