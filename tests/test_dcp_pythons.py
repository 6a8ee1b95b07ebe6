"""A sharded checkpoint's ``.metadata`` as every Python 3.9-3.13 pickles it is read, and the
stand-ins for ``getattr`` / ``operator.or_`` that some of them need call nothing else.

Python 3.11.0-3.11.4 (Debian 12's ``/usr/bin/python3`` is 3.11.2) pickles an enum member as
``getattr(EnumClass, 'NAME')``; the bytes below are what that Python writes for DCP's
``_MEM_FORMAT_ENCODING`` members (captured from it), and a whole ``.metadata`` is pickled here
the way it does, through a pickler whose enum reduction is 3.11.2's.
"""
import enum
import io
import operator
import pickle
import sys
import types

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties, TensorStorageMetadata, _MEM_FORMAT_ENCODING)

from hookloop.dist.dcp_metadata import RestrictedMetadataUnpickler
from hookloop.errors import CheckpointError

# pickle.dumps(_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST) by Python 3.11.2 (default protocol 4)
PY3112_MEMBER = (b'\x80\x04\x95s\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x07getattr\x94\x93\x94'
                 b'\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x14_MEM_FORMAT_ENCODING\x94\x93\x94'
                 b'\x8c\x13TORCH_CHANNELS_LAST\x94\x86\x94R\x94.')
# pickle.dumps((TORCH_CONTIGUOUS_FORMAT, TORCH_CHANNELS_LAST), protocol=2) by Python 3.11.2
PY3112_PROTOCOL2 = (b'\x80\x02c__builtin__\ngetattr\nq\x00ctorch.distributed.checkpoint.metadata\n'
                    b'_MEM_FORMAT_ENCODING\nq\x01X\x17\x00\x00\x00TORCH_CONTIGUOUS_FORMATq\x02\x86q\x03Rq\x04'
                    b'h\x00h\x01X\x13\x00\x00\x00TORCH_CHANNELS_LASTq\x05\x86q\x06Rq\x07\x86q\x08.')


class Py3112Pickler(pickle.Pickler):
    """Pickles enum members and combined flags as Python 3.11.2's ``Enum.__reduce_ex__`` does."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Flag) and obj._name_ not in type(obj).__members__:  # a combination: or_ of members
            members = [m for m in type(obj) if m._value_ & obj._value_]
            return operator.or_, (members[0], type(obj)(obj._value_ & ~members[0]._value_))
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj._name_)
        return NotImplemented


def dumps_as_3112(obj, protocol=4):
    out = io.BytesIO()
    Py3112Pickler(out, protocol=protocol).dump(obj)
    return out.getvalue()


def load(data):
    return RestrictedMetadataUnpickler(io.BytesIO(data), 'x/.metadata').load()


def sample_metadata():
    chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 3]))]
    properties = [TensorProperties(dtype=torch.float32),
                  TensorProperties(dtype=torch.bfloat16, memory_format=torch.channels_last)]
    return Metadata(
        state_dict_metadata={f'model.w{i}': TensorStorageMetadata(p, torch.Size([4, 3]), chunks)
                             for i, p in enumerate(properties)},
        storage_data={MetadataIndex(f'model.w{i}', torch.Size([0, 0])): _StorageInfo('__0_0.distcp', 64 * i, 64)
                      for i in range(2)})


def test_the_3_11_2_pickler_here_writes_the_bytes_python_3_11_2_writes():
    assert dumps_as_3112(_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST).endswith(PY3112_MEMBER[11:])
    assert dumps_as_3112((_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST),
                         protocol=2) == PY3112_PROTOCOL2


def test_enum_members_as_python_3_11_2_pickles_them_are_read():
    assert load(PY3112_MEMBER) is _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST
    assert load(PY3112_PROTOCOL2) == (_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
                                      _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST)


@pytest.mark.parametrize('protocol', [2, 3, 4, 5])
def test_a_whole_metadata_pickled_by_3_11_2_reads_as_the_one_pickled_here(protocol):
    metadata = sample_metadata()
    data = dumps_as_3112(metadata, protocol)
    assert b'getattr' in data
    loaded = load(data)
    assert loaded.state_dict_metadata == load(pickle.dumps(metadata, protocol=protocol)).state_dict_metadata
    assert loaded.state_dict_metadata['model.w1'].properties.memory_format == torch.channels_last
    assert [(i.fqn, tuple(i.offset)) for i in loaded.storage_data] == [('model.w0', (0, 0)), ('model.w1', (0, 0))]


def test_python_3_13_path_classes_are_read():
    """3.13 defines pathlib's classes in ``pathlib._local`` and pickles them under that name."""
    import pathlib
    data = (b'\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x0epathlib._local\x94\x8c\tPosixPath\x94\x93\x94'
            b'\x8c\x04/a/b\x94\x85\x94R\x94.')
    assert load(data) == pathlib.PurePosixPath('/a/b')


@pytest.mark.parametrize('target,name', [
    (b'\x8c\x05torch\x94\x8c\x04Size\x94\x93\x94', '__subclasses__'),  # torch.Size.__subclasses__
    (b'\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x14_MEM_FORMAT_ENCODING\x94\x93\x94', '__class__'),
    (b'\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x14_MEM_FORMAT_ENCODING\x94\x93\x94', 'mro'),
    (b'\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x14_MEM_FORMAT_ENCODING\x94\x93\x94', '_member_map_'),
    (b'\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x14_MEM_FORMAT_ENCODING\x94\x93\x94', 'NOT_A_MEMBER'),
    (b'\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x08Metadata\x94\x93\x94', '__init__'),
    (b'\x8c\x08builtins\x94\x8c\x03set\x94\x93\x94', 'mro'),
    (b'\x8c\x04text\x94', 'join'),  # a string, not a class
], ids=['Size.__subclasses__', 'enum.__class__', 'enum.mro', 'enum._member_map_', 'enum.NOT_A_MEMBER',
        'Metadata.__init__', 'set.mro', 'str.join'])
def test_getattr_to_anything_but_an_allowed_enums_member_is_refused(target, name):
    encoded = name.encode()
    data = (b'\x80\x04\x8c\x08builtins\x94\x8c\x07getattr\x94\x93\x94' + target
            + b'\x8c' + bytes([len(encoded)]) + encoded + b'\x94\x86\x94R\x94.')
    with pytest.raises(CheckpointError, match='only a member of an allowed enum') as refused:
        load(data)
    assert '\n' not in str(refused.value)


def test_a_member_looked_up_on_an_enum_member_is_refused():
    """``getattr(member, 'name')``: the first argument must be the enum class itself."""
    data = dumps_as_3112(_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST)[:-2]  # leaves the member on the stack
    data = (b'\x80\x04\x8c\x08builtins\x94\x8c\x07getattr\x94\x93\x94' + data[2:] + b'\x94'
            + b'\x8c\x04name\x94\x86\x94R\x94.')
    with pytest.raises(CheckpointError, match='only a member of an allowed enum'):
        load(data)


def test_or_combines_members_of_one_allowed_flag_only(monkeypatch):
    from hookloop.dist import dcp_metadata

    class Access(enum.Flag):
        READ = 1
        WRITE = 2

    module = types.ModuleType('hookloop_test_flags')
    module.Access = Access
    Access.__module__, Access.__qualname__ = module.__name__, 'Access'
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(dcp_metadata._ALLOWED, module.__name__, {'Access'})
    assert load(dumps_as_3112(Access.READ | Access.WRITE)) == Access.READ | Access.WRITE
    ints = b'\x80\x04\x8c\t_operator\x94\x8c\x03or_\x94\x93\x94K\x01K\x02\x86\x94R\x94.'
    with pytest.raises(CheckpointError, match='only members of one allowed flag'):
        load(ints)
    monkeypatch.setitem(dcp_metadata._ALLOWED, module.__name__, set())  # the same flag, not allowed
    with pytest.raises(CheckpointError, match='not part of torch.distributed.checkpoint metadata|allowed'):
        load(dumps_as_3112(Access.READ | Access.WRITE))
