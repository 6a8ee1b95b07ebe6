"""Reading a sharded checkpoint's ``.metadata`` without running code from it.

torch.distributed.checkpoint writes ``.metadata`` with ``pickle`` and its
``FileSystemReader`` reads it back with plain ``pickle.load``: a rigged file runs
whatever it names. Here the unpickler admits only the classes DCP itself writes there
(its metadata dataclasses, ``torch.Size``, dtypes, layouts, memory formats, paths);
any other global is refused with a CheckpointError naming the file and the global.
"""
import io
import os
import pickle

import torch

from .errors import CheckpointError

METADATA_FILE = '.metadata'

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


def _is_torch_constant(module, name):
    """dtypes (``torch.float32``), layouts and memory formats are pickled by name."""
    if module != 'torch' or name.startswith('_'):
        return False
    value = getattr(torch, name, None)
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))


class RestrictedMetadataUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` whose ``find_class`` admits only ``_ALLOWED`` globals."""

    def __init__(self, file, source):
        super().__init__(file)
        self.source = source

    def find_class(self, module, name):
        if name in _ALLOWED.get(module, ()) or _is_torch_constant(module, name):
            return super().find_class(module, name)
        raise CheckpointError(f'refusing to load {self.source!r}: it references {module}.{name}, which is not '
                              'part of torch.distributed.checkpoint metadata (loading it could run code)')


def read_dcp_metadata(path):
    """The ``Metadata`` object of the sharded checkpoint directory ``path``, read safely."""
    source = os.path.join(path, METADATA_FILE)
    try:
        with open(source, 'rb') as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointError(f'cannot read {source!r}: {exc.strerror or exc}') from None
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


def safe_reader(path):
    """A DCP ``FileSystemReader`` for ``path`` whose ``read_metadata`` uses the restricted
    unpickler; the tensor files it reads are raw bytes and ``weights_only`` loads."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_dcp_metadata(path)
            if getattr(metadata, 'storage_meta', None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(path)
