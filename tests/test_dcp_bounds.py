"""A sharded checkpoint's chunks must tile each tensor exactly, its bytes items must hold the
form of value this run has at their keys, and every decoder is bounded before it allocates.

The fuzz test at the end draws chunk layouts (grids, gaps, overlaps, out of range, huge
offsets) and bytes-item / tensor-slice payloads (types, sizes, hash-colliding keys, compressed
records, code): every bad one is one CheckpointError line, every good one loads bitwise, and
each case costs at most a multiple of a clean load's CPU time and peak memory.
"""
import io
import os
import random
import re
import shutil
import time
import zipfile

import pytest
import torch
from torch import nn
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.state_dict import get_state_dict

from dcp_helpers import CONFIG, Payload, append_to_shard, build, point_item_at, reseal, rewrite_metadata, saved, \
    write_sharded
from hookloop.checkpoint.checksum import file_checksum
from hookloop.checkpoint.format import load_checkpoint, save_checkpoint
from hookloop.checkpoint.sharded_files import MANIFEST_DIGEST, META_FILE, SHARD_CHECKSUMS
from hookloop.cli import main
from hookloop.dist.dcp_chunks import check_tiling
from hookloop.dist.dcp_load import load_dcp
from hookloop.dist.fsdp import verify_sharded
from hookloop.errors import CheckpointError

PRIME = (1 << 61) - 1  # k * PRIME all hash to 0: keys built from them share one bucket


def refuser(why):
    raise CheckpointError(why)


def grid(shape, rng, pieces=4):
    """A random grid layout of ``shape``: ``[(offsets, sizes)]`` that tiles it exactly."""
    cuts = [sorted({0, n, *(rng.randrange(1, n) for _ in range(rng.randrange(pieces)) if n > 1)}) for n in shape]
    layout = [((), ())]
    for dim_cuts in cuts:
        layout = [(o + (a,), s + (b - a,)) for o, s in layout for a, b in zip(dim_cuts, dim_cuts[1:])]
    return layout


def spoil(layout, shape, rng):
    """``layout`` with one defect: a gap, an overlap, a chunk out of range, a huge offset."""
    layout = [tuple(map(list, chunk)) for chunk in layout]
    kind = rng.choice(['gap', 'shifted', 'grown', 'huge', 'duplicate'])
    chunk = rng.choice(layout)
    d = rng.randrange(len(shape))
    if kind == 'gap':
        layout.remove(chunk)
    elif kind == 'shifted':  # same volume, moved: an overlap and a gap (the issue's case), or out of range
        chunk[0][d] += -1 if chunk[0][d] else 1
    elif kind == 'grown':
        chunk[1][d] += rng.randrange(1, 4)
    elif kind == 'huge':
        chunk[0][d] = rng.choice([1 << 62, 10 ** 30, (1 << 64) - 1])
    else:
        layout.append(tuple(map(list, chunk)))
    return [(tuple(o), tuple(s)) for o, s in layout]


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def test_the_issues_overlap_with_a_gap_is_refused_and_a_grid_is_not():
    with pytest.raises(CheckpointError, match="'w': its chunks overlap and leave a part no chunk covers"):
        check_tiling('w', (64, 64), [((0, 0), (40, 64)), ((8, 0), (24, 64))], refuser)
    check_tiling('w', (64, 64), [((0, 0), (40, 32)), ((0, 32), (40, 32)), ((40, 0), (24, 64))], refuser)


def test_random_layouts_tiles_pass_and_every_spoiled_one_is_refused():
    rng = random.Random(40)
    for case in range(400):
        shape = tuple(rng.randrange(1, 9) for _ in range(rng.randrange(1, 4)))
        layout = grid(shape, rng)
        rng.shuffle(layout)
        check_tiling('w', shape, layout, refuser)
        bad = spoil(layout, shape, rng)
        with pytest.raises(CheckpointError) as refused:
            check_tiling('w', shape, bad, refuser)
        assert '\n' not in str(refused.value), (case, shape, bad)


def test_a_layout_that_is_no_grid_is_refused_before_it_is_counted():
    """Staggered chunks cut a 4096 x 4096 tensor into ~4M cells: refused on the count alone."""
    n = 2048
    layout = [((i, i), (1, 4096 - i)) for i in range(n)] + [((i, 0), (1, i)) for i in range(1, n)]
    layout += [((n, 0), (4096 - n, 4096)), ((0, 0), (1, 0))]
    start = time.thread_time()
    with pytest.raises(CheckpointError, match='do not form a grid'):
        check_tiling('w', (4096, 4096), layout, refuser)
    assert time.thread_time() - start < 50 * _clean_tiling_time()


def _clean_tiling_time():
    layout = grid((4096, 4096), random.Random(1), pieces=64)
    start = time.thread_time()
    check_tiling('w', (4096, 4096), layout, refuser)
    return max(time.thread_time() - start, 1e-3)


# -- the issue's cases through the command line ---------------------------------------------

@pytest.fixture(scope='module')
def base(tmp_path_factory):
    """``(config file, a sharded checkpoint of a real run's state)``, written once."""
    root = tmp_path_factory.mktemp('dcp_base')
    config_file = root / 'cfg.py'
    config_file.write_text(CONFIG)
    return str(config_file), write_sharded(str(config_file), root)


@pytest.fixture
def sharded(base, tmp_path):
    """A copy of the base's checkpoint, free to be rigged; and the config."""
    shutil.copytree(base[1], tmp_path / 'ck')
    return base[0], tmp_path / 'ck'


def _train(config, tmp_path, path, capsys, name):
    code = main(['train', config, '--work-dir', str(tmp_path / name), '--resume', str(path)])
    err = capsys.readouterr().err.strip()
    return code, err


def test_overlapping_chunks_with_a_gap_do_not_resume(sharded, tmp_path, capsys):
    """Rows 0-4 and rows 1-3 of the first layer's [8, 64] weight: 512 elements "covered", rows
    5-7 by no chunk. Before: rc 0 with rows 5-7 left as the fresh model's."""
    config, path = sharded
    key = 'model.net.0.weight'

    def overlap(metadata):
        md = metadata.state_dict_metadata[key]
        assert list(md.size) == [8, 64]
        md.chunks = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([5, 64])),
                     ChunkStorageMetadata(torch.Size([1, 0]), torch.Size([3, 64]))]
        first = next(info for index, info in metadata.storage_data.items() if index.fqn == key)
        metadata.storage_data[MetadataIndex(key, torch.Size([1, 0]))] = first
    rewrite_metadata(path, overlap)
    reseal(path)
    code, err = _train(config, tmp_path, path, capsys, 'overlap')
    assert code != 0 and len(err.splitlines()) == 1 and 'Traceback' not in err, err
    assert key in err and 'overlap' in err


@pytest.mark.parametrize('value,message', [
    (torch.tensor(0.1), 'holds a tensor where a plain value belongs'),
    ({'a': 1}, 'holds a mapping where this run has a number'),
    ('0.1', 'holds a str where this run has a number'),
    (None, 'holds a none where this run has a number'),
    ([0.1], 'holds a sequence where this run has a number'),
])
def test_a_bytes_item_of_another_type_does_not_resume(sharded, tmp_path, capsys, value, message):
    """``lr`` as a tensor, a dict, ...: before, a traceback at the first step."""
    config, path = sharded
    point_item_at(path, 'optimizer.param_groups.0.lr', saved(value))
    reseal(path)
    code, err = _train(config, tmp_path, path, capsys, 'typed')
    assert code != 0 and len(err.splitlines()) == 1 and 'Traceback' not in err, err
    assert "'optimizer.param_groups.0.lr'" in err and message in err, err


def test_a_changed_lr_and_an_optional_flag_set_in_one_run_still_resume(sharded, tmp_path):
    config, path = sharded
    point_item_at(path, 'optimizer.param_groups.0.lr', saved(0.05))
    point_item_at(path, 'optimizer.param_groups.0.foreach', saved(True))  # None in this run
    reseal(path)
    trainer = build(config, tmp_path / 'dst', resume_from=str(path))
    try:
        trainer.train()
    finally:
        trainer.close()


# -- bounded decoders -----------------------------------------------------------------------

def with_pickle(pickled):
    """A ``torch.save`` archive (of 0.1) whose pickle record is ``pickled`` instead."""
    source = zipfile.ZipFile(io.BytesIO(saved(0.1)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, 'w') as target:
        for record in source.infolist():
            target.writestr(record.filename, pickled if record.filename.endswith('data.pkl')
                            else source.read(record.filename))
    return out.getvalue()


def colliding_dict_item(size):
    """An archive of about ``size`` bytes whose pickle is a dict with int keys that share one
    hash (written opcode by opcode: building such a dict here would itself take minutes)."""
    items = []
    for k in range(1, max(size // 16, 2)):
        key = (k * PRIME).to_bytes(12, 'little', signed=True)
        items.append(b'\x8a\x0c' + key + b'K\x00')  # LONG1 <12 bytes>, BININT1 0
    return with_pickle(b'\x80\x02}(' + b''.join(items) + b'u.')


def deflated(data, inflate_to=0):
    """``data`` (a torch.save archive) with every record deflated; ``inflate_to`` bytes of
    zeros appended to its pickle record (so it inflates that far)."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, 'w', compression=zipfile.ZIP_DEFLATED, compresslevel=9) as target:
        for record in source.infolist():
            body = source.read(record.filename)
            if record.filename.endswith('data.pkl'):
                body += b'\0' * inflate_to
            target.writestr(record.filename, body)
    return out.getvalue()


def test_hash_colliding_keys_and_compressed_records_are_refused_before_they_cost(sharded, tmp_path, capsys):
    config, path = sharded
    cases = {
        'colliding': ('optimizer.param_groups.0.lr', colliding_dict_item(4 << 10),
                      'as a dictionary key|far more values'),
        'deflated item': ('optimizer.param_groups.0.lr', deflated(saved(0.1), 4 << 20), 'compressed record'),
        'deflated slice': ('model.net.0.weight', deflated(saved(torch.zeros(8, 64)), 32 << 20), 'compressed record'),
    }
    for name, (key, data, message) in cases.items():
        case = tmp_path / name.replace(' ', '_')
        shutil.copytree(path, case)
        point_item_at(case, key, data)
        reseal(case)
        code, err = _train(config, tmp_path, case, capsys, f'{name}-run')
        assert code != 0 and len(err.splitlines()) == 1 and re.search(message, err) and key in err, (name, err)


@pytest.mark.parametrize('grown', ['extra.distcp', '__0_0.distcp'])
def test_a_huge_file_in_the_manifest_is_refused_before_it_is_hashed(sharded, monkeypatch, grown):
    """A 4 GiB (sparse) shard listed in a re-sealed manifest: before, hashed in full (+19 s)."""
    from hookloop.checkpoint import sharded_files
    _, path = sharded
    os.truncate(path / grown, 4 << 30) if (path / grown).exists() else open(path / grown, 'wb').truncate(4 << 30)
    manifest = path / SHARD_CHECKSUMS
    lines = [line for line in manifest.read_text().splitlines() if not line.endswith(grown)]
    manifest.write_text('\n'.join(lines + [f'{"0" * 64}  {grown}']) + '\n')
    rest = load_checkpoint(str(path / META_FILE))
    rest[MANIFEST_DIGEST] = file_checksum(str(manifest))
    save_checkpoint(rest, str(path / META_FILE))
    hashed = []
    real = sharded_files.file_checksum
    monkeypatch.setattr(sharded_files, 'file_checksum', lambda file, *a, **k: hashed.append(file) or real(file, *a, **k))
    with pytest.raises(CheckpointError, match=f"{grown}' is 4294967296 bytes, more than the .* its metadata accounts"):
        verify_sharded(str(path))
    assert not any(file.endswith(grown) for file in hashed), hashed


# -- fuzz: random chunk layouts and payloads, each refused in one line within bounds ---------

def _model(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 192), nn.ReLU(), nn.Linear(192, 6))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    return model, optimizer


def _states(seed):
    model_state, optim_state = get_state_dict(*_model(seed))
    return {'model': model_state, 'optimizer': optim_state}


class PeakMemory:
    """The rise of this process's peak resident memory over a block (Linux: the peak is reset
    through /proc/self/clear_refs), so native allocations (zip inflation) count too."""

    def __enter__(self):
        try:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
            self.before = self._read('VmRSS')
        except OSError:  # not Linux, or not allowed: the CPU bound is still asserted
            self.before = None
        return self

    def __exit__(self, *exc):
        self.rise = 0 if self.before is None else self._read('VmHWM') - self.before

    @staticmethod
    def _read(field):
        with open('/proc/self/status') as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ':'))


def _measured(path, states):
    """``(refusal or None, CPU seconds of this thread, peak memory rise)`` of loading ``path``.
    The load runs in this thread (torch limited to it by the test), so its CPU time is what it
    costs whatever else the machine runs (the whole process's would count idle threads spinning)."""
    with PeakMemory() as memory:
        start = time.thread_time()
        try:
            load_dcp(states, str(path))
            error = None
        except CheckpointError as exc:
            error = str(exc)
        cpu = time.thread_time() - start
    return error, cpu, memory.rise


def _write_layout(path, key, layout, tensor):
    """Replace the chunks of ``key`` by ``layout``, each stored as ``torch.save`` of its slice."""
    entries = {}
    for offsets, sizes in layout:
        index = tuple(slice(min(o, n), min(o + s, n)) for o, s, n in zip(offsets, sizes, tensor.shape))
        part = tensor[index].clone()
        if list(part.shape) != list(sizes):  # out of range: store what a forger would, the declared size
            part = torch.zeros([min(s, 64) for s in sizes], dtype=tensor.dtype)
        entries[offsets] = append_to_shard(path, saved(part))

    def edit(metadata):
        metadata.state_dict_metadata[key].chunks = [ChunkStorageMetadata(o, s) for o, s in layout]
        for index in [i for i in metadata.storage_data if i.fqn == key]:
            del metadata.storage_data[index]
        for offsets, (offset, length) in entries.items():
            metadata.storage_data[MetadataIndex(key, offsets)] = _StorageInfo('__0_0.distcp', offset, length)
    rewrite_metadata(path, edit)


def _payload(rng, key):
    """``(data, good)``: a random bytes item for ``key`` and whether it should load."""
    kind = rng.choice(['number', 'int', 'tensor', 'dict', 'list', 'str', 'none', 'colliding', 'deep',
                       'big_int', 'set', 'deflated', 'code', 'noise', 'bomb'])
    good = kind in ('number', 'int') or (kind == 'none' and key.endswith('foreach'))  # foreach: None here
    if key.endswith('params'):
        good = kind == 'list'
        value = {'list': [f'{i}.{w}' for i in (0, 2) for w in ('weight', 'bias')]}.get(kind)
    else:
        value = {'number': rng.random(), 'int': rng.randrange(10), 'list': [0.1, 0.2]}.get(kind)
    if kind in ('number', 'int', 'list'):
        return saved(value), good
    if kind == 'none':
        return saved(None), good
    if kind == 'tensor':
        return saved(torch.tensor(0.1)), False
    if kind == 'dict':
        return saved({'lr': 0.1}), False
    if kind == 'str':
        return saved('x' * rng.randrange(1, 4000)), False
    if kind == 'colliding':
        return colliding_dict_item(rng.choice([2 << 10, 6 << 10, 1 << 20])), False
    if kind == 'deep':
        nested = []
        for _ in range(rng.choice([50, 500])):
            nested = [nested]
        return saved(nested), False
    if kind == 'big_int':
        return saved(rng.choice([1 << 200, -(1 << 9000)])), False
    if kind == 'set':
        return saved({1, 2, 3}), False
    if kind == 'deflated':
        return deflated(saved(0.1)), False
    if kind == 'code':
        return saved(Payload('/nonexistent/pwned')), False
    if kind == 'noise':
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000))), False
    return deflated(saved(0.1), rng.choice([4 << 20, 64 << 20])), False  # 'bomb'


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fuzz_chunk_layouts_and_payloads_are_refused_in_one_line_within_bounds(tmp_path, one_thread):
    rng = random.Random(36)
    reference = _states(0)
    base = tmp_path / 'base'
    dcp.save(reference, checkpoint_id=str(base))
    tensors = {'model.0.weight': reference['model']['0.weight'], 'model.2.weight': reference['model']['2.weight']}
    clean = [_measured(base, _states(1)) for _ in range(5)]
    assert all(error is None for error, _, _ in clean), clean
    cpu_clean = sorted(c for _, c, _ in clean)[2]
    memory_clean = max(sorted(m for _, _, m in clean)[2], 1 << 20)  # at least 1 MiB: pages are reused
    outcomes = {'good': 0, 'refused': 0}
    print(f'clean load: {cpu_clean * 1e3:.1f} ms CPU, peak +{memory_clean >> 10} KiB')
    worst = [0, 0]
    for case in range(90):
        path = tmp_path / f'case{case}'
        shutil.copytree(base, path)
        if case % 2 == 0:  # a layout for one of the weights
            key = rng.choice(sorted(tensors))
            tensor = tensors[key]
            layout = grid(tuple(tensor.shape), rng, pieces=rng.choice([1, 3, 8]))
            good = rng.random() < 0.35
            if not good:
                layout = spoil(layout, tuple(tensor.shape), rng)
            _write_layout(path, key, layout, tensor)
        else:
            key = rng.choice(['optimizer.param_groups.0.lr', 'optimizer.param_groups.0.momentum',
                              'optimizer.param_groups.0.foreach', 'optimizer.param_groups.0.params'])
            data, good = _payload(rng, key)
            point_item_at(path, key, data)
        states = _states(1)
        error, cpu, rise = _measured(path, states)
        if good:
            assert error is None, (case, key, error)
            outcomes['good'] += 1
            if key in tensors:  # every element came from the checkpoint, none from the fresh model
                name = key.split('.', 1)[1]
                assert torch.equal(states['model'][name], reference['model'][name]), case
        else:
            assert error is not None and '\n' not in error and key in error, (case, key, error)
            outcomes['refused'] += 1
        assert cpu <= 10 * cpu_clean, (case, key, cpu, cpu_clean)
        assert rise <= 4 * memory_clean, (case, key, rise, memory_clean)
        worst = [max(worst[0], cpu / cpu_clean), max(worst[1], rise / memory_clean)]
        shutil.rmtree(path)
    assert not os.path.exists('/nonexistent/pwned')
    assert outcomes['good'] >= 15 and outcomes['refused'] >= 40, outcomes
    print(f'{outcomes}; worst case: {worst[0]:.1f}x the CPU time, {worst[1]:.1f}x the peak memory')
