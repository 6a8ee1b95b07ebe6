"""Loading a sharded checkpoint's tensors without trusting its metadata.

DCP's own reader follows ``.metadata`` wherever it points: a storage entry may name
``/dev/zero``, a FIFO or ``../../elsewhere``, and an item marked *bytes* is read with
``torch.load(weights_only=False)``, which runs code. :func:`load_dcp` instead

1. reads ``.metadata`` with the restricted unpickler (:mod:`hookloop.dist.dcp_metadata`);
2. checks it against the states this run loads into, *before any shard is read*: every key
   present, tensors as tensors with the same global shape and dtype, chunks that tile the
   tensor exactly (:mod:`hookloop.dist.dcp_chunks`), non-tensor values as bytes items no
   larger than the value this run holds there can need, and every storage entry a plain
   ``*.distcp`` file name of this directory (a regular file, no symlink) with its offset and
   length inside that file;
3. reads through :class:`SafeReader` (its own ``read_data``: each slice opened with
   ``O_NOFOLLOW``, bounds checked again, its archive checked before it is decoded) and
   :class:`SafePlanner`, whose bytes items are decoded as plain values of the form this run
   holds at their keys (:mod:`hookloop.dist.dcp_items`).

Every refusal is a CheckpointError naming the directory and the entry.
"""
import io
import os
import re
import stat

import torch

from .dcp_chunks import check_tiling
from .dcp_items import bytes_item_limit, check_tensor_archive, read_plain_value
from .dcp_metadata import index_key, read_dcp_metadata
from ..errors import CheckpointError

MAX_CHUNKS = 1 << 14  # chunks of one tensor: one per rank that saved it
TENSOR_OVERHEAD = 1 << 16  # torch.save's zip framing around a chunk's bytes
_SHARD_NAME = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.-]*\.distcp$')


def _dtype_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _numel(shape):
    n = 1
    for x in shape:
        n *= int(x)
    return n


def _ints(value, what, refuse):
    if not isinstance(value, (tuple, list, torch.Size)) or not all(type(x) is int and x >= 0 for x in value):
        refuse(f'{what} is not a list of non-negative integers')
    return tuple(value)


def check_storage(metadata, path):
    """``{index_key: (file name, offset, length)}`` of every storage entry, each checked to
    name a regular ``*.distcp`` file directly inside ``path`` and to lie within it."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    def refuse(why):
        raise CheckpointError(f'refusing to load sharded checkpoint {path!r}: {why}')

    storage = getattr(metadata, 'storage_data', None)
    if not isinstance(storage, dict):
        refuse('its .metadata has no storage table')
    sizes, entries = {}, {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str):
            refuse('its storage table has a key that is not a metadata index')
        name = getattr(info, 'relative_path', None)
        where = f'storage entry {index.fqn!r}'
        if not isinstance(name, str) or not _SHARD_NAME.match(name):
            refuse(f'{where} names {name!r}, not a shard file (*.distcp) inside the checkpoint directory')
        offset, length = getattr(info, 'offset', None), getattr(info, 'length', None)
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            refuse(f'{where} has an offset/length that is not a pair of non-negative integers')
        if getattr(info, 'transform_descriptors', None):
            refuse(f'{where} asks for stream transforms {info.transform_descriptors!r}, which hookloop '
                   'does not write')
        if name not in sizes:
            try:
                st = os.lstat(os.path.join(path, name))
            except OSError as exc:
                refuse(f'{where} names {name}, which cannot be read: {exc.strerror or exc}')
            if not stat.S_ISREG(st.st_mode):
                refuse(f'{where} names {name}, which is not a regular file (a symlink, FIFO or device?)')
            sizes[name] = st.st_size
        if offset + length > sizes[name]:
            refuse(f'{where} reads bytes {offset}..{offset + length} of {name}, which has {sizes[name]}')
        offsets = None if index.offset is None else _ints(index.offset, f'{where} offset', refuse)
        entries[index_key(index.fqn, offsets)] = (name, offset, length)
    return entries


def shard_ends(entries):
    """``{shard file name: the end of its last storage entry}`` of :func:`check_storage`'s entries."""
    ends = {}
    for name, offset, length in entries.values():
        ends[name] = max(ends.get(name, 0), offset + length)
    return ends


def check_against(metadata, expected, entries, path):
    """Refuse ``metadata`` unless it holds every flattened key of ``expected`` in the
    form this run needs (see the module docstring)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    def refuse(why):
        raise CheckpointError(f'sharded checkpoint {path!r} does not fit this run: {why}')

    described = getattr(metadata, 'state_dict_metadata', None)
    if not isinstance(described, dict):
        refuse('its .metadata has no state table')
    for key, value in expected.items():
        md = described.get(key)
        if md is None:
            refuse(f'it holds no {key!r} (a different model or optimizer?)')
        if isinstance(value, torch.Tensor):
            if not isinstance(md, TensorStorageMetadata):
                refuse(f'{key!r} is a tensor here but not in the checkpoint')
            size = _ints(md.size, f'{key!r} size', refuse)
            if size != tuple(value.shape):
                refuse(f'{key!r} has shape {list(size)} in the checkpoint, {list(value.shape)} here')
            dtype = getattr(getattr(md, 'properties', None), 'dtype', None)
            if dtype != value.dtype:
                refuse(f'{key!r} is {dtype} in the checkpoint, {value.dtype} here')
            chunks = md.chunks
            if not isinstance(chunks, list) or not chunks or len(chunks) > MAX_CHUNKS:
                refuse(f'{key!r} has {len(chunks) if isinstance(chunks, list) else "no"} chunks')
            layout = [(_ints(getattr(chunk, 'offsets', None), f'{key!r} chunk offsets', refuse),
                       _ints(getattr(chunk, 'sizes', None), f'{key!r} chunk sizes', refuse)) for chunk in chunks]
            check_tiling(key, size, layout, refuse)  # every element in exactly one chunk
            for offsets, sizes in layout:
                entry = entries.get(index_key(key, offsets))
                if entry is None:
                    refuse(f'{key!r} has a chunk at {list(offsets)} with no storage entry')
                limit = _numel(sizes) * _dtype_size(dtype) + TENSOR_OVERHEAD
                if entry[2] > limit:
                    refuse(f'{key!r}: a chunk of {list(sizes)} {dtype} is stored in {entry[2]} bytes, more than '
                           f'it can need ({limit})')
        else:
            if not isinstance(md, BytesStorageMetadata):
                refuse(f'{key!r} is a plain value here but a tensor in the checkpoint')
            entry = entries.get(index_key(key, None))
            if entry is None:
                refuse(f'{key!r} has no storage entry')
            if entry[2] > bytes_item_limit(value):
                refuse(f'{key!r} is a plain value stored in {entry[2]} bytes (more than the '
                       f'{bytes_item_limit(value)} its value here can need)')


def _open_slice(path, name, offset, length):
    """Bytes ``offset .. offset+length`` of the shard ``name`` (no symlink, regular file)."""
    fd = os.open(os.path.join(path, name), os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or offset + length > st.st_size:
            raise CheckpointError(f'refusing to load sharded checkpoint {path!r}: {name} changed while it was read')
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise CheckpointError(f'sharded checkpoint {path!r}: {name} is shorter than its metadata says')
    return data


def _reader_class():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType
    from torch.futures import Future

    class SafeReader(FileSystemReader):
        """A ``FileSystemReader`` that returns the metadata checked already and reads only
        the checked storage entries, bytes items through the planner's ``load_bytes``."""

        def __init__(self, path, metadata, entries):
            super().__init__(path)
            self._dir, self._metadata, self._entries = os.fspath(path), metadata, entries

        def read_metadata(self, *args, **kwargs):
            if getattr(self._metadata, 'storage_meta', None) is None:
                self._metadata.storage_meta = StorageMeta()
            self._metadata.storage_meta.load_id = self.load_id
            return self._metadata

        def read_data(self, plan, planner):
            for req in plan.items:
                index = req.storage_index
                entry = self._entries.get(index_key(index.fqn, index.offset))
                if entry is None:
                    raise CheckpointError(f'sharded checkpoint {self._dir!r}: no storage entry for {index.fqn!r}')
                data = _open_slice(self._dir, *entry)
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(data))
                    continue
                tensor = _load_tensor(data, index.fqn, self._dir)
                for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths)):
                    if dim >= tensor.dim() or start < 0 or start + length > tensor.shape[dim]:
                        raise CheckpointError(f'sharded checkpoint {self._dir!r}: {index.fqn!r} is stored with '
                                              f'shape {list(tensor.shape)}, smaller than its metadata says')
                    tensor = tensor.narrow(dim, start, length)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise CheckpointError(f'sharded checkpoint {self._dir!r}: {index.fqn!r} has shape '
                                          f'{list(tensor.shape)}, this run {list(target.shape)}')
                target.copy_(tensor)
                planner.commit_tensor(req, target)
            done = Future()
            done.set_result(None)
            return done

    return SafeReader


def _load_tensor(data, fqn, path):
    def refuse(why):
        raise CheckpointError(f'refusing to load sharded checkpoint {path!r}: {fqn!r} {why}')
    check_tensor_archive(data, refuse, 'is stored in an archive that')
    try:
        tensor = torch.load(io.BytesIO(data), map_location='cpu', weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or rigged slice
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f'sharded checkpoint {path!r}: {fqn!r} cannot be read as a tensor ({first})') from None
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f'sharded checkpoint {path!r}: {fqn!r} holds a {type(tensor).__name__}, not a tensor')
    return tensor


def _planner(path):
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        """DCP's planner, with bytes items read as plain values of the form this run holds
        at their keys (:func:`hookloop.dist.dcp_items.read_plain_value`)."""

        def load_bytes(self, read_item, value):
            fqn = read_item.dest_index.fqn

            def refuse(why):
                raise CheckpointError(f'refusing to load sharded checkpoint {path!r}: its item {fqn!r} is not '
                                      f'a plain value of the form this run has ({why})')
            loaded = read_plain_value(value.getvalue(), self.state_dict[fqn], refuse, 'it')
            if self.flatten_state_dict:  # what DCP's own load_bytes does with the value
                from torch.distributed.checkpoint._traverse import set_element
                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    return SafePlanner()


def _flatten(states):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    flat, _ = flatten_state_dict(states)
    return flat


def load_dcp(states, path):
    """Load ``states`` (nested dicts of tensors and plain values, DTensors included) in
    place from the sharded checkpoint directory ``path``, checked as the module says."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    path = os.fspath(path)
    metadata = read_dcp_metadata(path)
    entries = check_storage(metadata, path)
    check_against(metadata, _flatten(states), entries, path)
    reader = _reader_class()(path, metadata, entries)
    try:
        dcp.load(states, storage_reader=reader, planner=_planner(path))
    except CheckpointException as exc:
        for failure in getattr(exc, 'failures', {}).values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, CheckpointError):
                raise inner from None
        raise CheckpointError(f'cannot load sharded checkpoint {path!r}: '
                              f'{str(exc).strip().splitlines()[-1]}') from None
    return states
