"""One-pass integrity (issue 26): the checksum is computed while a checkpoint is written and
verified while it is read, and it catches what the separate full read caught before."""
import hashlib
import io
import os
import random

import pytest
import torch

from hookloop.checkpoint import format as ckpt
from hookloop.fileio import hashing
from hookloop.checkpoint.checksum import checksum_path, verify_checksum
from hookloop.checkpoint.format import load_checkpoint, save_checkpoint
from hookloop.errors import CheckpointError

ALGORITHMS = ['sha256'] + (['xxh128'] if hashing.available('xxh128') else [])


def make_checkpoint(seed=0, tensors=12):
    generator = torch.Generator().manual_seed(seed)
    return {'meta': {'iter': seed}, 'state_dict': {f'w{i}': torch.randn(500 + 37 * i, generator=generator)
                                                   for i in range(tensors)}}


@pytest.fixture(params=ALGORITHMS)
def algorithm(request, monkeypatch):
    monkeypatch.setattr(hashing, 'default_algorithm', lambda: request.param)
    return request.param


def reference_digest(data, algorithm):
    if algorithm == 'sha256':
        return hashlib.sha256(data).hexdigest()
    import xxhash
    return xxhash.xxh3_128(data).hexdigest()


def test_the_digest_written_is_the_files_and_names_its_algorithm(tmp_path, algorithm):
    path = str(tmp_path / 'a.pth')
    save_checkpoint(make_checkpoint(), path)
    assert checksum_path(path) == path + {'sha256': '.sha256', 'xxh128': '.xxh128'}[algorithm]
    with open(path, 'rb') as f:
        data = f.read()
    with open(checksum_path(path)) as f:
        assert f.read() == f'{reference_digest(data, algorithm)}  a.pth\n'  # sha256sum / xxh128sum format
    assert verify_checksum(path) is True
    assert sorted(os.listdir(tmp_path)) == ['a.pth', os.path.basename(checksum_path(path))]


def damaged_variants(data, other):
    """(label, bytes): flipped bytes all over the file, truncations, another checkpoint."""
    size = len(data)
    for position in (0, 3, 40, 100, size // 3, size // 2, size - 200, size - 22, size - 1):
        flipped = bytearray(data)
        flipped[position] ^= 0x01
        yield f'flip@{position}', bytes(flipped)
    for length in (1, 30, size // 2, size - 22, size - 1):
        yield f'truncated@{length}', data[:length]
    yield 'swapped', other
    yield 'appended', data + b'\0'


def test_one_pass_check_catches_what_the_full_read_catches(tmp_path, algorithm):
    path = str(tmp_path / 'c.pth')
    save_checkpoint(make_checkpoint(0), path)
    save_checkpoint(make_checkpoint(1), str(tmp_path / 'other.pth'))
    with open(path, 'rb') as f:
        data = f.read()
    with open(tmp_path / 'other.pth', 'rb') as f:
        other = f.read()
    name = hashing.NAMES[algorithm]
    for label, damaged in damaged_variants(data, other):
        with open(path, 'wb') as f:
            f.write(damaged)
        with pytest.raises(CheckpointError) as before:  # the separate full read of before
            verify_checksum(path)
        with pytest.raises(CheckpointError) as now:
            load_checkpoint(path)
        assert str(now.value) == str(before.value), label
        assert f'is damaged: its {name} does not match {os.path.basename(checksum_path(path))}' in str(now.value)
    with open(path, 'wb') as f:
        f.write(data)
    loaded = load_checkpoint(path)
    for key, value in make_checkpoint(0)['state_dict'].items():
        assert torch.equal(loaded['state_dict'][key], value)


def test_sha256_sidecars_of_earlier_versions_keep_verifying(tmp_path):
    path = str(tmp_path / 'old.pth')
    torch.save(make_checkpoint(), path)
    with open(path, 'rb') as f:
        data = f.read()
    with open(path + '.sha256', 'w') as f:  # what every earlier version wrote
        f.write(f'{hashlib.sha256(data).hexdigest()}  old.pth\n')
    assert load_checkpoint(path)['meta'] == {'iter': 0}
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x04
    with open(path, 'wb') as f:
        f.write(bytes(flipped))
    with pytest.raises(CheckpointError, match=r"old\.pth' is damaged: its SHA-256 does not match old\.pth\.sha256"):
        load_checkpoint(path)


def test_a_save_replaces_the_sidecar_of_another_algorithm(tmp_path, monkeypatch):
    if len(ALGORITHMS) < 2:
        pytest.skip('needs xxhash')
    path = str(tmp_path / 'x.pth')
    monkeypatch.setattr(hashing, 'default_algorithm', lambda: 'sha256')
    save_checkpoint(make_checkpoint(0), path)
    monkeypatch.setattr(hashing, 'default_algorithm', lambda: 'xxh128')
    save_checkpoint(make_checkpoint(1), path)
    assert sorted(os.listdir(tmp_path)) == ['x.pth', 'x.pth.xxh128']
    assert load_checkpoint(path)['meta'] == {'iter': 1}
    ckpt.remove_checkpoint(path)
    assert os.listdir(tmp_path) == []


def test_an_xxh128_sidecar_without_xxhash_is_one_clear_error(tmp_path, monkeypatch):
    if len(ALGORITHMS) < 2:
        pytest.skip('needs xxhash')
    path = str(tmp_path / 'y.pth')
    save_checkpoint(make_checkpoint(), path)  # xxh128 (the default with xxhash)
    monkeypatch.setattr(hashing, 'xxhash', None)
    monkeypatch.setattr(hashing, 'default_algorithm', lambda: 'sha256')
    with pytest.raises(CheckpointError, match=r'XXH128 checksum .*y\.pth\.xxh128.* pip install xxhash'):
        load_checkpoint(path)
    assert load_checkpoint(path, verify=False)['meta'] == {'iter': 0}


class CountingFile(io.RawIOBase):
    def __init__(self, data):
        self._file, self.bytes_read = io.BytesIO(data), 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self._file.seek(offset, whence)

    def tell(self):
        return self._file.tell()

    def readinto(self, buffer):
        count = self._file.readinto(buffer)
        self.bytes_read += count
        return count

    def read(self, size=-1):
        data = self._file.read(size)
        self.bytes_read += len(data)
        return data


@pytest.mark.parametrize('tensors', [3, 25])
def test_a_verified_load_reads_the_file_about_once(tmp_path, algorithm, tensors):
    buffer = io.BytesIO()
    writer = hashing.HashingWriter(buffer, algorithm)
    torch.save(make_checkpoint(tensors=tensors), writer)
    data = buffer.getvalue()
    assert writer.hexdigest() == reference_digest(data, algorithm)
    raw = CountingFile(data)
    reader = hashing.HashingReader(raw, algorithm)
    torch.load(reader, weights_only=True)
    torch_read = raw.bytes_read
    assert reader.finish() == reference_digest(data, algorithm)
    # what torch reads anyway, plus at most the zip's small pieces it skips or reads out of order
    assert raw.bytes_read <= torch_read + len(data) * 0.15 + 70_000


def test_the_reader_hashes_every_byte_once_whatever_the_reads(algorithm):
    rng = random.Random(0)
    data = bytes(rng.getrandbits(8) for _ in range(300_000))
    expected = reference_digest(data, algorithm)
    for _ in range(40):
        reader = hashing.HashingReader(io.BytesIO(data), algorithm)
        for _ in range(rng.randrange(1, 30)):
            reader.seek(rng.randrange(0, len(data) + 10))
            if rng.random() < 0.5:
                reader.read(rng.choice([-1, 0, 1, 100, 5000, 100_000]))
            else:
                reader.readinto(bytearray(rng.choice([1, 64, 4096, 70_000])))
        assert reader.finish() == expected
