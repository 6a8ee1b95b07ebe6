"""``{{_base_.name}}`` in a ``.py`` config (MMCV's syntax): the value ``name`` (dotted, e.g.
``{{_base_.model.backbone}}``) has in the merged ``_base_`` files, usable in any expression
(``dataset_info = {{_base_.dataset_info}}``, ``dict(**{{_base_.train_cfg}})``).

The file is read as text, each reference becomes a private name bound to its value, and the
file runs with those names defined; ``_base_`` itself is read from the text first.
"""
import ast
import re

from ..errors import ConfigError

REFERENCE = re.compile(r'\{\{\s*_base_\.([\w.]+)\s*\}\}')


def has_references(path):
    if not path.endswith('.py'):
        return False
    with open(path, encoding='utf-8') as f:
        return REFERENCE.search(f.read()) is not None


def substitute(path):
    """``(text, {placeholder: dotted name})``: the file's text with the references replaced."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    names = {}

    def placeholder(match):
        name = f'__hookloop_base_ref_{len(names)}__'
        names[name] = match.group(1)
        return name
    return REFERENCE.sub(placeholder, text), names


def read_bases(path, text):
    """The ``_base_`` value of the file (a string or a list of strings), without running it."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise ConfigError(f'config {path!r} does not parse: {exc.msg} (line {exc.lineno})') from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == '_base_' for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(f'config {path!r}: _base_ must be a string or a list of strings') from None
    raise ConfigError(f'config {path!r} uses {{{{_base_.…}}}} but has no _base_ to refer to')


def lookup(base, dotted, path):
    value = base
    for key in dotted.split('.'):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, (list, tuple)) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise ConfigError(f'config {path!r}: {{{{_base_.{dotted}}}}} is not in its _base_ files')
    return value


def run(path, text, names, base):
    """The top-level names of the file run with the references bound to the base's values."""
    import copy
    namespace = {'__file__': path, '__name__': '__config__'}
    namespace.update({name: copy.deepcopy(lookup(base, dotted, path)) for name, dotted in names.items()})
    try:
        exec(compile(text, path, 'exec'), namespace)
    except ConfigError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f'config {path!r} does not parse: {first}') from None
    return namespace
