"""Sharded (DCP) checkpoints: no code runs from a shard, nothing outside the directory is
read, the metadata is checked against the model and optimizer before any shard is read."""
import io
import os
import pickle

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from dcp_helpers import CONFIG, build, config, reseal, rewrite_metadata, rig_bytes_item, write_sharded  # noqa: F401
from hookloop.checkpoint.checksum import file_checksum
from hookloop.checkpoint.format import load_checkpoint, save_checkpoint, update_pointer
from hookloop.checkpoint.sharded_files import MANIFEST_DIGEST, META_FILE, METADATA_FILE, SHARD_CHECKSUMS
from hookloop.cli import main
from hookloop.dist.dcp_metadata import read_dcp_metadata
from hookloop.errors import CheckpointError
from hookloop.dist.fsdp import verify_sharded

def run_all_ways(config, tmp_path, rigged, capsys):
    """--resume DIR (the CLI), pointer + --resume auto, EMAHook(resume_from=DIR): each one
    clear line, exit status 1, nothing trained."""
    lines = []
    code = main(['train', config, '--work-dir', str(tmp_path / 'cli'), '--resume', str(rigged)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and 'Traceback' not in err and len(err.splitlines()) == 1, err
    lines.append(err)

    auto_dir = tmp_path / 'auto'
    os.makedirs(auto_dir)
    os.rename(rigged, auto_dir / 'iter_2.pth')
    update_pointer(str(auto_dir), str(auto_dir / 'iter_2.pth'))
    code = main(['train', config, '--work-dir', str(auto_dir), '--resume', 'auto'])
    err = capsys.readouterr().err.strip()
    assert code != 0 and 'Traceback' not in err and len(err.splitlines()) == 1, err
    lines.append(err)
    os.rename(auto_dir / 'iter_2.pth', rigged)

    ema_config = tmp_path / 'ema.py'
    ema_config.write_text(CONFIG + f"custom_hooks = [dict(type='EMAHook', resume_from={str(rigged)!r})]\n")
    code = main(['train', str(ema_config), '--work-dir', str(tmp_path / 'ema')])
    err = capsys.readouterr().err.strip()
    assert code != 0 and 'Traceback' not in err and len(err.splitlines()) == 1, err
    lines.append(err)
    return lines


@pytest.mark.parametrize('manifest', ['resealed', 'removed'])
def test_a_pickle_in_a_bytes_item_runs_no_code_any_way(config, tmp_path, monkeypatch, capsys, manifest):
    marker = tmp_path / 'pwned'
    rigged = write_sharded(config, tmp_path, 'rigged')
    rig_bytes_item(rigged, marker)
    if manifest == 'resealed':
        reseal(rigged)
    else:  # no shards.sha256 at all: the switch for old checkpoints lets it through to the loader
        os.remove(rigged / SHARD_CHECKSUMS)
        monkeypatch.setenv('HOOKLOOP_ALLOW_UNVERIFIED', '1')
    lines = run_all_ways(config, tmp_path, rigged, capsys)
    assert not marker.exists()
    for line in lines:
        assert 'optimizer.param_groups.0.lr' in line and 'not a plain value' in line, line


def test_without_the_manifest_a_sharded_dir_is_refused_unless_switched(config, tmp_path, monkeypatch):
    path = write_sharded(config, tmp_path)
    os.remove(path / SHARD_CHECKSUMS)
    with pytest.raises(CheckpointError,
                       match='no valid checksum.*shards.sha256 is missing.*HOOKLOOP_ALLOW_UNVERIFIED=1'):
        verify_sharded(str(path))
    monkeypatch.setenv('HOOKLOOP_ALLOW_UNVERIFIED', '1')
    with pytest.warns(UserWarning, match='without an integrity check'):
        verify_sharded(str(path))


def test_manifest_may_not_name_files_outside_and_upper_case_digests_are_fine(config, tmp_path):
    path = write_sharded(config, tmp_path)
    manifest = path / SHARD_CHECKSUMS
    text = manifest.read_text()
    manifest.write_text(text.upper().replace('__0_0.DISTCP', '__0_0.distcp').replace('.METADATA', '.metadata'))
    rest = load_checkpoint(str(path / META_FILE))
    rest[MANIFEST_DIGEST] = file_checksum(str(manifest)).upper()
    save_checkpoint(rest, str(path / META_FILE))
    verify_sharded(str(path))  # upper-case hex is the same digest
    outside = tmp_path / 'secret'
    outside.write_bytes(b'x')
    manifest.write_text(text + f'{file_checksum(str(outside))}  ../secret\n')
    reseal_manifest_digest(path)
    with pytest.raises(CheckpointError, match=r"lists '\.\./secret', which is not a shard file inside"):
        verify_sharded(str(path))


def reseal_manifest_digest(path):
    rest = load_checkpoint(str(path / META_FILE))
    rest[MANIFEST_DIGEST] = file_checksum(str(path / SHARD_CHECKSUMS))
    save_checkpoint(rest, str(path / META_FILE))


def test_a_real_sharded_checkpoint_resumes_like_its_file_checkpoint(config, tmp_path):
    """The checked loader restores what the plain file checkpoint of the same state does."""
    path = write_sharded(config, tmp_path)
    from_dir = build(config, tmp_path / 'dst', resume_from=str(path))
    from_file = build(config, tmp_path / 'ref', resume_from=str(tmp_path / 'src' / 'iter_2.pth'))
    for trainer in (from_dir, from_file):
        try:
            trainer.train()
        finally:
            trainer.close()
    for key, value in from_file.model.state_dict().items():
        assert torch.equal(from_dir.model.state_dict()[key], value), key
    for a, b in zip(from_file.optimizer.state.values(), from_dir.optimizer.state.values()):
        assert torch.equal(a['momentum_buffer'], b['momentum_buffer'])
    assert from_dir.optimizer.param_groups[0]['lr'] == from_file.optimizer.param_groups[0]['lr']


@pytest.mark.parametrize('edit,message', [
    (lambda md: setattr(next(iter(md.storage_data.values())), 'relative_path', '/dev/zero'),
     "names '/dev/zero', not a shard file"),
    (lambda md: setattr(next(iter(md.storage_data.values())), 'relative_path', '../other/__0_0.distcp'),
     "names '../other/__0_0.distcp', not a shard file"),
    (lambda md: setattr(next(iter(md.storage_data.values())), 'length', 1 << 40), 'reads bytes .* which has'),
    (lambda md: setattr(next(iter(md.storage_data.values())), 'transform_descriptors', ['zstd']),
     'asks for stream transforms'),
])
def test_storage_entries_may_only_name_bytes_inside_the_dir(config, tmp_path, edit, message):
    path = write_sharded(config, tmp_path)
    rewrite_metadata(path, edit)
    reseal(path)
    with pytest.raises(CheckpointError, match=message):
        verify_sharded(str(path))


def test_a_shard_that_is_a_symlink_or_fifo_is_refused_without_blocking(config, tmp_path, monkeypatch):
    path = write_sharded(config, tmp_path)
    os.remove(path / SHARD_CHECKSUMS)
    monkeypatch.setenv('HOOKLOOP_ALLOW_UNVERIFIED', '1')
    shard = path / '__0_0.distcp'
    os.remove(shard)
    os.mkfifo(shard)
    with pytest.raises(CheckpointError, match='not a regular file'):
        verify_sharded(str(path))
    os.remove(shard)
    os.symlink('/dev/zero', shard)
    with pytest.raises(CheckpointError, match='not a regular file|symbolic link'):
        verify_sharded(str(path))
    os.remove(path / METADATA_FILE)
    os.symlink('/dev/zero', path / METADATA_FILE)
    with pytest.raises(CheckpointError, match=r'\.metadata.* is a symbolic link'):
        read_dcp_metadata(str(path))


def test_metadata_is_checked_against_the_model_before_any_shard_is_read(config, tmp_path):
    path = write_sharded(config, tmp_path)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    def as_bytes(metadata):  # a tensor of the model declared a bytes item
        key = next(k for k in metadata.state_dict_metadata if k.startswith('model.'))
        metadata.state_dict_metadata[key] = BytesStorageMetadata()
        for index in metadata.storage_data:
            if index.fqn == key:
                object.__setattr__(index, 'offset', None)
    rewrite_metadata(path, as_bytes)
    reseal(path)
    trainer = build(config, tmp_path / 'dst', resume_from=str(path))
    try:
        with pytest.raises(CheckpointError, match='is a tensor here but not in the checkpoint'):
            trainer.train()
    finally:
        trainer.close()
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.state_dict().values(),
                                                 build(config, tmp_path / 'fresh').model.state_dict().values()))


# -- the unpickler: no process-wide state changed, no keys that collide ------------------------

def test_build_on_a_class_or_an_enum_member_is_refused_and_changes_nothing(tmp_path):
    from hookloop.dist.dcp_metadata import RestrictedMetadataUnpickler
    on_class = b'\x80\x02ctorch\nSize\n}X\x03\x00\x00\x00fooK\x01sb.'
    on_member = (b'\x80\x02ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n'
                 b'K\x01\x85R}X\x05\x00\x00\x00valueK\x07sb.')
    for data in (on_class, on_member):
        with pytest.raises(CheckpointError, match='sets the state of a'):
            RestrictedMetadataUnpickler(io.BytesIO(data), 'x').load()
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING
    assert not hasattr(torch.Size, 'foo') and _MEM_FORMAT_ENCODING(1).value == 1


def test_keys_whose_hashes_collide_cost_nothing(tmp_path):
    """Offsets k * (2**61 - 1) all hash alike in a tuple, so DCP's MetadataIndex keys built from
    them collide: the restricted unpickler's keys hash over a string instead; other key
    types (tuples) are refused."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
    from hookloop.dist.dcp_metadata import RestrictedMetadataUnpickler
    prime = (1 << 61) - 1
    keys = [MetadataIndex('w', torch.Size([k * prime])) for k in range(1, 2001)]
    assert len({hash(k) for k in keys}) == 1  # DCP's own class: one bucket for all 2000
    metadata = Metadata(state_dict_metadata={}, storage_data={k: _StorageInfo('__0_0.distcp', 0, 1) for k in keys})
    loaded = RestrictedMetadataUnpickler(io.BytesIO(pickle.dumps(metadata)), 'x').load()
    assert len({hash(k) for k in loaded.storage_data}) == 2000
    tuple_keys = pickle.dumps(Metadata(state_dict_metadata={(1, 2): None}))
    with pytest.raises(CheckpointError, match='uses a tuple as a dictionary key'):
        RestrictedMetadataUnpickler(io.BytesIO(tuple_keys), 'x').load()


# -- fuzz: random metadata, nothing outside read, no code, one line ---------------------------

def _mutations(rng, metadata, marker):
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                       TensorStorageMetadata)
    infos = list(metadata.storage_data.values())
    described = metadata.state_dict_metadata
    kind = rng.randrange(6)
    if kind == 0:
        info = rng.choice(infos)
        info.relative_path = rng.choice(['/dev/zero', '../outside.distcp', 'fifo.distcp', 'link.distcp',
                                         '__0_0.distcp', '', 'a/b.distcp', '.metadata', 5, None, '..'])
    elif kind == 1:
        info = rng.choice(infos)
        values = [-1, 0, 7, rng.randrange(1 << 16), 1 << 40, (1 << 61) - 1, 'x', None, 1.5]
        info.offset, info.length = rng.choice(values), rng.choice(values)
    elif kind == 2:
        rng.choice(infos).transform_descriptors = rng.choice([[], ['zstd'], 'x', [1]])
    elif kind == 3:
        key = rng.choice(sorted(described))
        md = described[key]
        if isinstance(md, TensorStorageMetadata):
            choice = rng.randrange(4)
            if choice == 0:
                md.size = torch.Size([rng.randrange(0, 1 << 20) for _ in range(rng.randrange(0, 3))])
            elif choice == 1:
                md.properties.dtype = rng.choice([torch.float16, torch.int64, torch.bool, torch.float64])
            elif choice == 2:
                md.chunks = [ChunkStorageMetadata(torch.Size([rng.randrange(-2, 1 << 30) for _ in md.size]),
                                                  torch.Size([rng.randrange(0, 1 << 30) for _ in md.size]))
                             for _ in range(rng.randrange(0, 3))]
            else:
                described[key] = BytesStorageMetadata()
        else:
            del described[key]
    elif kind == 4:
        key = rng.choice(sorted(described))
        described[key] = TensorStorageMetadata(properties=None, size=torch.Size([2]), chunks=[]) \
            if rng.random() < 0.5 else BytesStorageMetadata()
    else:  # a bytes item whose payload would run code under weights_only=False
        return 'payload'
    return None


def _payload_into(path, marker, rng):
    rig_bytes_item(path, marker, key=rng.choice(['optimizer.param_groups.0.lr', 'optimizer.param_groups.0.momentum',
                                                'optimizer.param_groups.0.params']))


def test_fuzz_dcp_metadata(config, tmp_path, monkeypatch):
    import random
    import shutil
    import builtins
    from hookloop.dist.dcp_load import load_dcp
    monkeypatch.setenv('HOOKLOOP_ALLOW_UNVERIFIED', '1')  # fuzz the loader, not the checksums
    base = write_sharded(config, tmp_path, 'base', manifest=False)
    holder = build(config, tmp_path / 'holder2')
    holder.close()
    outside = tmp_path / 'outside.distcp'
    outside.write_bytes(b'\0' * 4096)
    marker = tmp_path / 'pwned'
    rng = random.Random(20)
    size = sum(p.stat().st_size for p in base.iterdir())
    opened, reads = [], []
    real_open, real_os_open, real_pread = builtins.open, os.open, os.pread

    def spy_open(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else None)
        return real_open(file, *args, **kwargs)

    def spy_os_open(file, *args, **kwargs):
        opened.append(os.fspath(file))
        return real_os_open(file, *args, **kwargs)

    def spy_pread(fd, n, offset):
        reads.append(n)
        return real_pread(fd, n, offset)

    outcomes = {'loaded': 0, 'refused': 0}
    for case in range(60):
        path = tmp_path / f'case{case}'
        shutil.copytree(base, path)
        os.mkfifo(path / 'fifo.distcp')
        os.symlink(outside, path / 'link.distcp')
        if _mutations(rng, metadata := read_dcp_metadata(str(path)), marker) == 'payload':
            _payload_into(path, marker, rng)
        else:
            rewrite_metadata(path, lambda md: (md.__dict__.update(metadata.__dict__)))
        if rng.random() < 0.2:  # and a flipped byte in .metadata itself
            data = bytearray((path / METADATA_FILE).read_bytes())
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            (path / METADATA_FILE).write_bytes(bytes(data))
        model_state, optim_state = get_state_dict(holder.model, holder.optimizer)
        opened.clear()
        reads.clear()
        monkeypatch.setattr(builtins, 'open', spy_open)
        monkeypatch.setattr(os, 'open', spy_os_open)
        monkeypatch.setattr(os, 'pread', spy_pread)
        try:
            verify_sharded(str(path))
            load_dcp({'model': model_state, 'optimizer': optim_state}, str(path))
            outcomes['loaded'] += 1
        except CheckpointError as exc:
            assert '\n' not in str(exc), str(exc)
            outcomes['refused'] += 1
        finally:
            monkeypatch.setattr(builtins, 'open', real_open)
            monkeypatch.setattr(os, 'open', real_os_open)
            monkeypatch.setattr(os, 'pread', real_pread)
        assert not marker.exists(), case
        for name in opened:
            assert name is None or os.path.realpath(name).startswith(str(path) + os.sep), (case, name)
        assert sum(reads) <= 2 * size, case
        shutil.rmtree(path)
    assert outcomes['refused'] > 20 and outcomes['loaded'] > 0, outcomes


def test_fuzz_build_states_on_allowed_classes_change_no_process_state(tmp_path):
    """Random ``GLOBAL``/``REDUCE``/``NEWOBJ`` + ``BUILD`` pickles over every allowed name: each
    is refused in one line (or is not metadata), and no allowed class, enum member or dtype
    gains or changes an attribute."""
    import random
    from hookloop.dist.dcp_metadata import _ALLOWED
    rng = random.Random(6)
    names = [(m, n) for m, ns in _ALLOWED.items() for n in sorted(ns)] + [('torch', 'float32'), ('torch', 'strided')]
    import importlib
    objects = [getattr(importlib.import_module(m), n) for m, n in names]
    before = [dict(vars(o)) if hasattr(o, '__dict__') else None for o in objects]
    float32_repr = repr(torch.float32)
    for case in range(300):
        module, name = rng.choice(names)
        head = b'\x80\x02c' + module.encode() + b'\n' + name.encode() + b'\n'
        how = rng.randrange(3)
        if how == 1:  # call it with no arguments
            head += b')R'
        elif how == 2:  # cls.__new__(cls)
            head += b')\x81'
        key = rng.choice([b'__class__', b'__dict__', b'value', b'fqn', b'size', b'__setstate__', b'x', b'_name_'])
        state = rng.choice([b'}X' + len(key).to_bytes(4, 'little') + key + b'K\x01s',  # {key: 1}
                            b'NX' + len(key).to_bytes(4, 'little') + key + b'K\x01\x86',  # a bare tuple
                            b'N}X' + len(key).to_bytes(4, 'little') + key + b'K\x01s\x86'])  # (None, {key: 1})
        data = head + state + b'b.'
        try:
            read_metadata_bytes(data)
        except CheckpointError as exc:
            assert '\n' not in str(exc)
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f'case {case}: {type(exc).__name__}: {exc}') from None
    after = [dict(vars(o)) if hasattr(o, '__dict__') else None for o in objects]
    assert before == after and repr(torch.float32) == float32_repr


def read_metadata_bytes(data):
    """As read_dcp_metadata: the restricted unpickler, then anything that fails is one line."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, METADATA_FILE), 'wb') as f:
            f.write(data)
        return read_dcp_metadata(d)
