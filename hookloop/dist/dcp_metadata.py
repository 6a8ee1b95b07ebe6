"""Reading a sharded checkpoint's ``.metadata`` without running code from it.

torch.distributed.checkpoint writes ``.metadata`` with ``pickle`` and its
``FileSystemReader`` reads it back with plain ``pickle.load``: a rigged file runs
whatever it names. Here the unpickler admits only the classes DCP itself writes there
(its metadata dataclasses, ``torch.Size``, dtypes, layouts, memory formats, paths);
any other global is refused with a CheckpointError naming the file and the global.

Allowed classes can still be abused, so the unpickler (Python's pure-Python one, whose
opcodes can be checked one by one) also refuses:

* ``BUILD`` on anything but a fresh instance of DCP's metadata dataclasses, with only their
  field names: no attribute is set on a class, an enum member or a dtype (process-wide state);
* dictionary keys and set members other than strings, bools, small integers and ``None``
  (and DCP's ``MetadataIndex``, whose hash is taken over a string): keys whose hashes an
  attacker can make collide would turn a small file into minutes of work;
* files that are not regular files (``/dev/zero``, FIFOs, symlinks) or larger than
  :data:`MAX_METADATA_BYTES`.

Every Python from 3.9 to 3.13 writes the same metadata in its own way, and each is read:
an enum member is pickled as ``EnumClass(value)``, or (Python 3.11.0-3.11.4, Debian 12's
``python3``) as ``getattr(EnumClass, 'NAME')`` and a combined flag as ``operator.or_(a, b)``,
or (``@global_enum``) by its module-level name; Python 3.13 names paths ``pathlib._local.*``;
protocols 0-2 name ``__builtin__``. ``getattr`` and ``or_`` are never the real functions: the
unpickler hands out stand-ins that look up a member of an allowed enum by name, or combine two
members of one allowed flag, and refuse anything else.
"""
import _compat_pickle
import enum
import io
import os
import pickle
import sys

import torch

from ..checkpoint.sharded_files import MAX_METADATA_BYTES, METADATA_FILE, read_regular_file
from ..errors import CheckpointError

_SMALL_INT = 1 << 60  # |x| below this: hash(x) == x, no two such keys collide (but -1/-2)

_DCP_METADATA_CLASSES = ('Metadata', 'TensorStorageMetadata', 'TensorProperties', 'ChunkStorageMetadata',
                         'BytesStorageMetadata', 'MetadataIndex', 'StorageMeta', '_MEM_FORMAT_ENCODING')

# module -> names that may appear as globals in a DCP ``.metadata``. Each is a data class,
# an enum or a constructor of plain values: none reads, writes or runs anything.
_ALLOWED = {
    'torch.distributed.checkpoint.metadata': set(_DCP_METADATA_CLASSES),
    'torch.distributed.checkpoint.filesystem': {'_StorageInfo'},
    'torch.serialization': {'_get_layout'},  # maps a layout's name to the torch.layout object
    'torch': {'Size'},
    'pathlib': {'PosixPath', 'PurePosixPath', 'WindowsPath', 'PureWindowsPath', 'Path'},
    'collections': {'OrderedDict'},
    'builtins': {'set', 'frozenset', 'slice', 'complex'},
}
_MODULE_ALIASES = {'pathlib._local': 'pathlib'}  # where Python 3.13 defines pathlib's classes


def _is_torch_constant(module, name):
    """dtypes (``torch.float32``), layouts and memory formats are pickled by name."""
    if module != 'torch' or name.startswith('_'):
        return False
    value = getattr(torch, name, None)
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))


def _allowed_enum(cls):
    """True for an enum class that ``_ALLOWED`` names (the class itself, not a look-alike)."""
    if not isinstance(cls, enum.EnumMeta):
        return False
    module = sys.modules.get(cls.__module__)
    return cls.__name__ in _ALLOWED.get(cls.__module__, ()) and getattr(module, cls.__name__, None) is cls


def _safe_index_class():
    """DCP's ``MetadataIndex`` with a hash over a string (randomised per process, so an
    attacker cannot make keys collide); equal to the original field for field."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    class SafeMetadataIndex(MetadataIndex):
        def __hash__(self):
            return hash(index_key(self.fqn, self.offset))

    SafeMetadataIndex.__module__ = MetadataIndex.__module__
    return SafeMetadataIndex


def index_key(fqn, offset):
    """A string naming a storage entry: what ``storage_data`` is looked up by."""
    return f'{fqn}\0{None if offset is None else tuple(int(x) for x in offset)}'


def _build_targets():
    from torch.distributed.checkpoint import metadata as md
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    return (md.Metadata, md.TensorStorageMetadata, md.TensorProperties, md.ChunkStorageMetadata,
            md.BytesStorageMetadata, md.MetadataIndex, md.StorageMeta, _StorageInfo)


class RestrictedMetadataUnpickler(pickle._Unpickler):  # the Python implementation: its opcodes can be checked
    """A ``pickle.Unpickler`` whose ``find_class`` admits only ``_ALLOWED`` globals and whose
    ``BUILD``, ``SETITEM(S)``, ``ADDITEMS``, ``FROZENSET`` and ``REDUCE`` are checked."""

    def __init__(self, file, source):
        super().__init__(file)
        self.source = source
        self._index_class = _safe_index_class()
        self._targets = _build_targets()
        dispatch = dict(pickle._Unpickler.dispatch)
        dispatch[pickle.BUILD[0]] = RestrictedMetadataUnpickler._load_build
        dispatch[pickle.SETITEM[0]] = RestrictedMetadataUnpickler._load_setitem
        dispatch[pickle.SETITEMS[0]] = RestrictedMetadataUnpickler._load_setitems
        dispatch[pickle.ADDITEMS[0]] = RestrictedMetadataUnpickler._load_additems
        dispatch[pickle.FROZENSET[0]] = RestrictedMetadataUnpickler._load_frozenset
        dispatch[pickle.REDUCE[0]] = RestrictedMetadataUnpickler._load_reduce
        self.dispatch = dispatch

    def refuse(self, why):
        raise CheckpointError(f'refusing to load {self.source!r}: {why}')

    def find_class(self, module, name):
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle itself maps them
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        module = _MODULE_ALIASES.get(module, module)
        if module == 'torch.distributed.checkpoint.metadata' and name == 'MetadataIndex':
            return self._index_class
        if (module, name) == ('builtins', 'getattr'):
            return self._enum_member
        if module in ('operator', '_operator') and name == 'or_':
            return self._flag_union
        if name in _ALLOWED.get(module, ()) or _is_torch_constant(module, name):
            return super().find_class(module, name)
        member = self._global_enum_member(module, name)
        if member is not None:
            return member
        self.refuse(f'it references {module}.{name}, which is not part of torch.distributed.checkpoint '
                    'metadata (loading it could run code)')

    # -- the standard library's other ways to pickle an enum member (see the module docstring)
    def _enum_member(self, cls, name):
        """``getattr(cls, name)`` for a member of an allowed enum only."""
        if not _allowed_enum(cls) or type(name) is not str or name not in cls.__members__:
            self.refuse(f'it calls getattr({getattr(cls, "__name__", type(cls).__name__)}, {name!r:.40}): only a '
                        'member of an allowed enum may be looked up by name')
        return cls.__members__[name]

    def _flag_union(self, a, b):
        """``a | b`` for two members of one allowed flag only."""
        if type(a) is not type(b) or not isinstance(a, enum.Flag) or not _allowed_enum(type(a)):
            self.refuse(f'it calls operator.or_ on a {type(a).__name__} and a {type(b).__name__}: only members '
                        'of one allowed flag may be combined')
        return a | b

    @staticmethod
    def _global_enum_member(module, name):
        """The member ``name`` of an allowed ``@global_enum`` of ``module`` (pickled by its global name)."""
        loaded = sys.modules.get(module)
        for cls_name in _ALLOWED.get(module, ()):
            cls = getattr(loaded, cls_name, None)
            if _allowed_enum(cls) and name in cls.__members__ and getattr(loaded, name, None) is cls.__members__[name]:
                return cls.__members__[name]
        return None

    def _check_keys(self, keys):
        for key in keys:
            if key is None or isinstance(key, (str, bool, self._index_class)):
                continue
            if type(key) is int and -_SMALL_INT < key < _SMALL_INT:
                continue
            self.refuse(f'it uses a {type(key).__name__} as a dictionary key or set member '
                        '(not something torch.distributed.checkpoint writes)')

    def _load_build(self):
        state, inst = self.stack[-1], self.stack[-2]
        if isinstance(inst, type) or type(inst) not in self._targets and not isinstance(inst, self._index_class):
            self.refuse(f'it sets the state of a {type(inst).__name__} object (only metadata records may be built)')
        fields = set(getattr(type(inst), '__dataclass_fields__', ()))
        slots = state[1] if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict) else None
        names = state if isinstance(state, dict) else (slots if slots is not None and state[0] is None else None)
        if names is not None:
            self._check_keys(names)
            if not set(names) <= fields:
                self.refuse(f'it sets {sorted(map(str, set(names) - fields))[:3]} on a {type(inst).__name__}, '
                            'which has no such fields')
        elif not (isinstance(state, tuple) and getattr(type(inst), '__setstate__', None) not in
                  (None, getattr(object, '__setstate__', None))):
            self.refuse(f'it sets the state of a {type(inst).__name__} in a form DCP does not write')
        pickle._Unpickler.dispatch[pickle.BUILD[0]](self)

    def _load_setitem(self):
        self._check_keys([self.stack[-2]])
        pickle._Unpickler.dispatch[pickle.SETITEM[0]](self)

    def _load_setitems(self):
        items = self.stack  # the items since the last MARK: key, value, key, value, ...
        self._check_keys(items[0::2])
        pickle._Unpickler.dispatch[pickle.SETITEMS[0]](self)

    def _load_additems(self):
        self._check_keys(self.stack)
        pickle._Unpickler.dispatch[pickle.ADDITEMS[0]](self)

    def _load_frozenset(self):
        self._check_keys(self.stack)
        pickle._Unpickler.dispatch[pickle.FROZENSET[0]](self)

    def _load_reduce(self):
        args, func = self.stack[-1], self.stack[-2]
        if func in (set, frozenset, dict, self.find_class('collections', 'OrderedDict')) and args:
            if not isinstance(args, tuple) or len(args) != 1 or not isinstance(args[0], (list, tuple)):
                self.refuse(f'it builds a {getattr(func, "__name__", func)} from something other than a list')
            items = args[0]
            keys = items if func in (set, frozenset) else [p[0] if isinstance(p, tuple) and p else p for p in items]
            self._check_keys(keys)
        pickle._Unpickler.dispatch[pickle.REDUCE[0]](self)


def read_dcp_metadata(path, limit=MAX_METADATA_BYTES):
    """The ``Metadata`` object of the sharded checkpoint directory ``path``, read safely."""
    source = os.path.join(path, METADATA_FILE)
    data = read_regular_file(source, limit, 'checkpoint metadata')
    try:
        metadata = RestrictedMetadataUnpickler(io.BytesIO(data), source).load()
    except CheckpointError:
        raise
    except Exception:  # random or truncated bytes: pickle raises many kinds
        raise CheckpointError(f'{source!r} is not a checkpoint metadata file (damaged or not written by '
                              'torch.distributed.checkpoint)') from None
    from torch.distributed.checkpoint.metadata import Metadata
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f'{source!r} is not a checkpoint metadata file (it holds a '
                              f'{type(metadata).__name__})')
    return metadata
