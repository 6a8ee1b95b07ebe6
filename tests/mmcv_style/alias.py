"""A rename-only alias for tests: ``import mmcv.X`` gives ``hookloop.compat.mmcv.X``
(``mmcv.runner`` is ``hookloop.compat.mmcv`` itself, ``mmcv.runner.Y`` is
``hookloop.compat.mmcv.Y``). Code written against MMCV's module paths (a repository's hook,
constructor or train script) then runs unchanged; a module hookloop lacks is an ImportError,
as it would be for a user.

    def test_x(mmcv_alias):            # the fixture in conftest.py installs and removes it
        from mmcv.runner import HOOKS   # hookloop.compat.mmcv.HOOKS
"""
import importlib
import importlib.abc
import importlib.util
import sys


def hookloop_name(name):
    """The hookloop module an ``mmcv`` module path names."""
    parts = name.split('.')[1:]
    if parts[:1] == ['runner']:
        parts = parts[1:]
    return '.'.join(['hookloop', 'compat', 'mmcv'] + parts)


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = importlib.import_module(hookloop_name(spec.name))
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module):
        """The hookloop module ran when it was imported; it keeps its own spec (the import
        machinery set the alias's on it)."""
        module.__spec__ = self.own_spec


class MMCVAlias(importlib.abc.MetaPathFinder):
    """The finder; :meth:`install` / :meth:`remove` put it on ``sys.meta_path`` and take it
    (with the ``mmcv`` entries of ``sys.modules``) away."""

    def find_spec(self, name, path, target=None):
        if name != 'mmcv' and not name.startswith('mmcv.'):
            return None
        try:
            found = importlib.util.find_spec(hookloop_name(name))
        except ModuleNotFoundError:
            return None
        if found is None:
            return None
        return importlib.util.spec_from_loader(name, _AliasLoader(), is_package=True)

    def install(self):
        sys.meta_path.insert(0, self)
        return self

    def remove(self):
        sys.meta_path.remove(self)
        for name in [n for n in sys.modules if n == 'mmcv' or n.startswith('mmcv.')]:
            del sys.modules[name]
